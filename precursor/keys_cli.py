"""``precursor keys``: create the ed25519 key pair that signs model artifacts and releases, or rotate to a new one.

The private key file is created with mode 0600 and its content is never printed or logged; only paths and the
public key's id are shown.

With ``--rotate-from OLD.key`` the new key pair also gets a key rotation statement, appended to the chain in
``keyring.json`` beside it (started from the one beside the old key): signed by the old key(s) and the new one, it
moves every edge that reads a release carrying it to the new key, and revokes the old key unless ``--keep-old``
(see :mod:`models.edge.releases`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from models.edge.releases import KEYRING_FILE, KeyRotationError, KeyTrust, load_keyring, make_rotation, save_keyring
from models.edge.signing import generate_keypair, key_id, load_private_key
from precursor.common import fail


def keys_command(
    directory: Annotated[Path, typer.Argument(help="Folder to write NAME.key (private, mode 0600) and NAME.pub into.")],
    name: Annotated[str, typer.Option(help="File name stem of the key pair.")] = "precursor",
    rotate_from: Annotated[
        list[Path] | None,
        typer.Option(
            help="Rotate from this private key (repeat it to meet the current threshold): the new key signs releases "
            f"from now on, and the rotation is appended to DIRECTORY/{KEYRING_FILE}."
        ),
    ] = None,
    keep_old: Annotated[bool, typer.Option(help="Keep the keys trusted now beside the new one.")] = False,
    threshold: Annotated[int, typer.Option(min=1, help="Signatures the next rotation needs.")] = 1,
) -> None:
    """Create an ed25519 key pair for signing model artifacts and releases. Existing keys are never overwritten."""
    try:
        if rotate_from:
            rotate(directory, name, rotate_from, keep_old=keep_old, threshold=threshold)
            return
        pair = generate_keypair(directory, name)
    except (FileExistsError, ValueError) as err:
        raise fail(err, 1) from None
    typer.echo(f"key_id:      {pair.key_id}")
    typer.echo(f"private key: {pair.private_key_path} (mode 0600; keep it secret, never commit it)")
    typer.echo(f"public key:  {pair.public_key_path} (give this to every edge and registry that must trust it)")


def rotate(directory: Path, name: str, old_key_files: list[Path], *, keep_old: bool, threshold: int) -> None:
    """A new key pair in ``directory`` and the rotation to it, appended to ``directory/keyring.json``.

    Everything that can be checked is checked before the new key is written: the old keys load and are enough to
    sign the rotation. Raises ``ValueError`` (``KeyFileError``, ``KeyRotationError``) naming what is wrong.
    """
    old_keys = [load_private_key(path) for path in old_key_files]
    chain = load_keyring(Path(directory) / KEYRING_FILE) or load_keyring(old_key_files[0].parent / KEYRING_FILE)
    old_public = {key_id(k.public_key()): k.public_key() for k in old_keys}
    # What every edge that follows the chain trusts now; with no chain, the keys the edges were installed with.
    now = KeyTrust.stated_by(chain[-1]) if chain else KeyTrust.configured(old_public)
    signing_now = set(old_public) & set(now.keys)
    if len(signing_now) < now.threshold:
        raise KeyRotationError(
            f"{now.describe()} needs {now.threshold} of its keys to sign a rotation; --rotate-from gave "
            f"{len(signing_now)} of them ({', '.join(sorted(old_public))})"
        )
    signing_after = 1 + (len(signing_now) if keep_old else 0)
    if threshold > signing_after:
        raise ValueError(
            f"--threshold {threshold}: the new trust would be signed by only {signing_after} of its keys here"
        )
    pair = generate_keypair(directory, name)
    new_key = load_private_key(pair.private_key_path)
    kept = list(now.keys.values()) if keep_old else []
    rotation = make_rotation(chain, [new_key.public_key(), *kept], signers=[*old_keys, new_key], threshold=threshold)
    after = now.advance(rotation)  # the very check an edge makes
    save_keyring(Path(directory) / KEYRING_FILE, [*chain, rotation])
    revoked = sorted(set(now.keys) - set(after.keys))
    typer.echo(f"key_id:      {pair.key_id}")
    typer.echo(f"private key: {pair.private_key_path} (mode 0600; keep it secret, never commit it)")
    typer.echo(f"public key:  {pair.public_key_path}")
    typer.echo(f"rotation:    {after.describe()} in {Path(directory) / KEYRING_FILE}")
    typer.echo(f"revoked:     {', '.join(revoked) or 'none'}")
    typer.echo("edges follow it with the next release signed by the new key; sign releases with it from now on")
