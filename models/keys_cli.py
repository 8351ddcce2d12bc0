"""``precursor keys``: create the ed25519 key pair that signs model artifacts.

The private key file is created with mode 0600 and its content is never printed or logged; only paths and the
public key's id are shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from models.signing import generate_keypair


def keys_command(
    directory: Annotated[Path, typer.Argument(help="Folder to write NAME.key (private, mode 0600) and NAME.pub into.")],
    name: Annotated[str, typer.Option(help="File name stem of the key pair.")] = "precursor",
) -> None:
    """Create an ed25519 key pair for signing model artifacts. Existing keys are never overwritten."""
    try:
        pair = generate_keypair(directory, name)
    except (FileExistsError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(f"key_id:      {pair.key_id}")
    typer.echo(f"private key: {pair.private_key_path} (mode 0600; keep it secret, never commit it)")
    typer.echo(f"public key:  {pair.public_key_path} (give this to every edge and registry that must trust it)")
