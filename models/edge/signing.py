"""Ed25519 keys and signatures for model artifacts: who published a model, and that nobody changed it since.

A key pair is two PEM files: ``NAME.key`` (the private key, mode 0600, never printed) and ``NAME.pub``. A public key
is known by its ``key_id``: the first 16 hex digits of the sha256 of its 32 raw bytes, short enough for a log line and
a Kafka message, long enough that two keys of one fleet never collide by chance.

>>> import tempfile
>>> from pathlib import Path
>>> keys_dir = Path(tempfile.mkdtemp())
>>> pair = generate_keypair(keys_dir)
>>> oct(pair.private_key_path.stat().st_mode & 0o777)
'0o600'
>>> trusted = load_public_keys(keys_dir)
>>> list(trusted) == [pair.key_id]
True
>>> signature = sign(b"manifest bytes", load_private_key(pair.private_key_path))
>>> verify(b"manifest bytes", signature, pair.key_id, trusted)
>>> verify(b"manifest bytez", signature, pair.key_id, trusted)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
models.edge.signing.SignatureError: signature by key ... does not match the signed data: ...
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

PRIVATE_KEY_SUFFIX = ".key"
PUBLIC_KEY_SUFFIX = ".pub"
KEY_ID_HEX_DIGITS = 16
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")

TrustedKeys = Mapping[str, Ed25519PublicKey]
"""key_id -> public key: the keys whose signatures a loader accepts."""


class SignatureError(ValueError):
    """A signature that is missing, malformed, made by an unknown key, or does not match the data it claims to sign."""


class KeyFileError(ValueError):
    """A key file that cannot be read as the kind of key it should hold. The text names the file, never its content."""


@dataclass(frozen=True)
class KeyPair:
    """Where a generated key pair was written, and the id its signatures carry."""

    private_key_path: Path
    public_key_path: Path
    key_id: str


def key_id(public_key: Ed25519PublicKey) -> str:
    """The short, stable name of a public key: hex sha256 of its raw bytes, first 16 digits."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX_DIGITS]


def generate_keypair(directory: Path | str, name: str = "precursor") -> KeyPair:
    """Create ``NAME.key`` (mode 0600) and ``NAME.pub`` in ``directory``; refuse to overwrite either."""
    if not _KEY_NAME.match(name):
        raise ValueError(
            f"key name={name!r} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter/digit"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private_path = directory / f"{name}{PRIVATE_KEY_SUFFIX}"
    public_path = directory / f"{name}{PUBLIC_KEY_SUFFIX}"
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists; pick another name or directory (keys are never overwritten)")

    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_key = private_key.public_key()
    public_pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    # Created with mode 0600 from the first byte: a chmod after writing would leave a window where others can read it.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    os.chmod(private_path, 0o600)  # the umask may have narrowed it further; make it exactly 0600
    public_path.write_bytes(public_pem)
    return KeyPair(private_key_path=private_path, public_key_path=public_path, key_id=key_id(public_key))


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """Read an unencrypted PEM ed25519 private key. Errors name the file, never its bytes."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise KeyFileError(f"cannot read private key file {path}: {err.strerror}") from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("private key file %s has mode %s: readable by others; chmod 600 it", path, oct(mode))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        # The library's message never echoes the key material; keep only its class to be sure.
        raise KeyFileError(f"{path} is not an unencrypted PEM private key ({type(err).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an ed25519 private key")
    return key


def load_public_key(path: Path | str) -> Ed25519PublicKey:
    """Read one PEM ed25519 public key."""
    path = Path(path)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as err:
        raise KeyFileError(f"cannot read public key file {path}: {err.strerror}") from None
    except (ValueError, TypeError) as err:
        raise KeyFileError(f"{path} is not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an ed25519 public key")
    return key


def load_public_keys(source: Path | str | Iterable[Path | str]) -> dict[str, Ed25519PublicKey]:
    """Trusted keys by key_id, from a directory (every ``*.pub`` in it) or from a list of ``.pub`` files."""
    if isinstance(source, str | Path):
        source = Path(source)
        if source.is_dir():
            paths = sorted(source.glob(f"*{PUBLIC_KEY_SUFFIX}"))
            if not paths:
                raise KeyFileError(f"no *{PUBLIC_KEY_SUFFIX} public key files in directory {source}")
        else:
            paths = [source]
    else:
        paths = [Path(p) for p in source]
    keys: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        public_key = load_public_key(path)
        keys[key_id(public_key)] = public_key
    return keys


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """A public key as one short line of text: base64 of its 32 raw bytes (what an enrolled-edges file lists)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def public_key_from_text(text: str) -> Ed25519PublicKey:
    """The key :func:`public_key_text` wrote; ``KeyFileError`` if it is not base64 of 32 bytes."""
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        raise KeyFileError(f"public key {text[:24]!r}... is not base64 of a raw 32-byte ed25519 key") from None


def sign(data: bytes, private_key: Ed25519PrivateKey) -> str:
    """The base64 ed25519 signature of ``data``."""
    return base64.b64encode(private_key.sign(data)).decode("ascii")


def verify(data: bytes, signature: str, signer_key_id: str, trusted_keys: TrustedKeys) -> None:
    """Return if ``signature`` is a valid signature of ``data`` by trusted key ``signer_key_id``; else raise."""
    public_key = trusted_keys.get(signer_key_id)
    if public_key is None:
        known = ", ".join(sorted(trusted_keys)) or "none"
        raise SignatureError(f"signed by key_id={signer_key_id!r}, which is not a trusted key (trusted: {known})")
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"signature={signature[:24]!r}... is not valid base64") from None
    try:
        public_key.verify(raw, data)
    except InvalidSignature:
        raise SignatureError(
            f"signature by key {signer_key_id} does not match the signed data: it was changed after signing "
            "or signed by another key"
        ) from None
