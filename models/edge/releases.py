"""Signed release statements and the keys allowed to sign them: The Update Framework's ideas, over ed25519.

A :class:`~precursor.contracts.messages.ModelRelease` is signed as a whole: :func:`release_statement` is the one
canonical form
(sorted-key compact JSON of every field but the release signature, tagged so it can pass for nothing else), and both
the publisher (:class:`ReleaseSigner`) and the edge (:func:`verify_release_statement`) go through it, so the two cannot
drift. Each release says when it was issued (its order per target: an edge never goes back to an older one) and when
it expires (a feed frozen by an attacker cannot hold an edge on a stale release forever).

Which keys may sign is a chain of :class:`~precursor.contracts.messages.KeyRotation` statements. Trust version 0 is
the keys an
edge is configured with (any one of them signs). Version N+1 names the new keys and how many of them must sign the
next rotation (``threshold``); it counts only when signed by ``threshold`` keys of version N *and* by ``threshold`` of
its own keys (so nobody names a key they do not hold). A key left out of the new version is revoked: its releases are
refused from then on. Every release carries the chain, so an edge that was off during a rotation follows it with the
next release it reads. The chain lives beside the signing key in ``keyring.json``; ``precursor keys --rotate-from``
writes it.

>>> import tempfile
>>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
>>> old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
>>> edge = KeyTrust.configured({key_id(old.public_key()): old.public_key()})
>>> rotation = make_rotation([], [new.public_key()], signers=[old, new])
>>> moved = edge.follow([rotation])
>>> (moved.version, key_id(new.public_key()) in moved.keys, key_id(old.public_key()) in moved.keys)
(1, True, False)
>>> edge.follow([make_rotation([], [new.public_key()], signers=[new])])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
models.edge.releases.KeyRotationError: key rotation to trust version 1 is signed by 0 of the keys trusted now ...
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, TypeAdapter, ValidationError

from models.edge.signing import (
    KeyFileError,
    SignatureError,
    TrustedKeys,
    key_id,
    load_private_key,
    public_key_from_text,
    public_key_text,
    sign,
    verify,
)
from precursor.contracts.messages import KeyRotation, KeySignature, ModelRelease

log = logging.getLogger(__name__)

DEFAULT_RELEASE_VALIDITY = timedelta(days=30)
KEYRING_FILE = "keyring.json"
RELEASE_STATEMENT = "precursor.model-release"
ROTATION_STATEMENT = "precursor.key-rotation"

_KEYRING = TypeAdapter(list[KeyRotation])


class KeyRotationError(SignatureError):
    """A key rotation that does not follow from the keys trusted now: wrong version, too few signatures, bad keys."""


class ExpiredReleaseError(ValueError):
    """A release without an expiry, or past it."""


# --- canonical bytes: what is signed -------------------------------------------------------------------------------


def _canonical(message: BaseModel, exclude: set[str], statement: str) -> bytes:
    # None fields are left out, so a field added later (it must default to None) leaves old signatures valid.
    fields = message.model_dump(mode="json", exclude=exclude, exclude_none=True)
    fields["statement"] = statement
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def release_statement(release: ModelRelease) -> bytes:
    """The bytes a release key signs: every field of ``release`` but ``release_signature``."""
    return _canonical(release, {"release_signature"}, RELEASE_STATEMENT)


def rotation_statement(rotation: KeyRotation) -> bytes:
    """The bytes a key rotation's signers sign: every field but the signatures."""
    return _canonical(rotation, {"signatures"}, ROTATION_STATEMENT)


def release_digest(release: ModelRelease) -> str:
    """What identifies this exact message, signature included: a copy changed in any byte that matters has another
    digest, so remembering a refusal by it can never shadow the genuine release."""
    return hashlib.sha256(_canonical(release, set(), RELEASE_STATEMENT)).hexdigest()


# --- public keys inside statements ----------------------------------------------------------------------------------


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """A key named in a rotation: a key that does not read makes the rotation fail, not the caller."""
    try:
        return public_key_from_text(text)
    except KeyFileError as err:
        raise KeyRotationError(str(err)) from None


# --- trust -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyTrust:
    """The keys an edge accepts signatures from now, at trust ``version``; ``threshold`` of them sign a rotation."""

    version: int
    keys: dict[str, Ed25519PublicKey] = field(repr=False)
    threshold: int = 1

    @classmethod
    def configured(cls, keys: TrustedKeys) -> KeyTrust:
        """Trust version 0: the keys an edge is installed with, any one of which signs."""
        return cls(version=0, keys=dict(keys), threshold=1)

    @classmethod
    def stated_by(cls, rotation: KeyRotation) -> KeyTrust:
        """The trust ``rotation`` states, taken as given (a publisher's own record; edges use :meth:`advance`)."""
        return cls(
            version=rotation.version,
            keys={named: public_key_from_b64(text) for named, text in rotation.keys.items()},
            threshold=rotation.threshold,
        )

    def describe(self) -> str:
        return f"trust version {self.version} ({', '.join(sorted(self.keys)) or 'no keys'}, threshold {self.threshold})"

    def advance(self, rotation: KeyRotation) -> KeyTrust:
        """The trust ``rotation`` moves to, or :class:`KeyRotationError` naming why it does not count."""
        if rotation.version != self.version + 1:
            raise KeyRotationError(
                f"key rotation to trust version {rotation.version} does not follow {self.describe()}: "
                f"the next one is {self.version + 1}"
            )
        new_keys: dict[str, Ed25519PublicKey] = {}
        for named, text in rotation.keys.items():
            public_key = public_key_from_b64(text)
            if key_id(public_key) != named:
                raise KeyRotationError(f"key rotation {rotation.version}: key {named} is really {key_id(public_key)}")
            new_keys[named] = public_key
        if rotation.threshold > len(new_keys):
            raise KeyRotationError(
                f"key rotation {rotation.version}: threshold {rotation.threshold} is more than its {len(new_keys)} keys"
            )
        statement = rotation_statement(rotation)
        for who, keys, needed in (
            ("trusted now", self.keys, self.threshold),
            ("it names", new_keys, rotation.threshold),
        ):
            signers = _valid_signers(rotation.signatures, statement, keys)
            if len(signers) < needed:
                raise KeyRotationError(
                    f"key rotation to trust version {rotation.version} is signed by {len(signers)} of the keys {who} "
                    f"({', '.join(sorted(keys))}), needs {needed}"
                )
        return KeyTrust(version=rotation.version, keys=new_keys, threshold=rotation.threshold)

    def follow(self, chain: Sequence[KeyRotation]) -> KeyTrust:
        """The trust after the rotations of ``chain`` newer than this one, taken in order."""
        trust = self
        for rotation in sorted(chain, key=lambda r: r.version):
            if rotation.version > trust.version:
                trust = trust.advance(rotation)
        return trust


def _valid_signers(
    signatures: Sequence[KeySignature], statement: bytes, keys: Mapping[str, Ed25519PublicKey]
) -> set[str]:
    """The distinct keys of ``keys`` with a valid signature over ``statement`` (a key counts once, however often)."""
    valid: set[str] = set()
    for signature in signatures:
        if signature.key_id in keys and signature.key_id not in valid:
            try:
                verify(statement, signature.signature, signature.key_id, keys)
            except SignatureError:
                continue
            valid.add(signature.key_id)
    return valid


def make_rotation(
    keyring: Sequence[KeyRotation],
    new_keys: Sequence[Ed25519PublicKey],
    *,
    signers: Sequence[Ed25519PrivateKey],
    threshold: int = 1,
    now: datetime | None = None,
) -> KeyRotation:
    """The next rotation after ``keyring``: ``new_keys`` sign from now on. ``signers`` must hold enough of the keys
    trusted now and of ``new_keys`` (see :meth:`KeyTrust.advance`); the caller checks with it."""
    rotation = KeyRotation(
        version=(max((r.version for r in keyring), default=0)) + 1,
        keys={key_id(k): public_key_text(k) for k in new_keys},
        threshold=threshold,
        issued_at=now or datetime.now(UTC),
    )
    statement = rotation_statement(rotation)
    signatures = [KeySignature(key_id=key_id(k.public_key()), signature=sign(statement, k)) for k in signers]
    return rotation.model_copy(update={"signatures": signatures})


def current_trust(configured: TrustedKeys, keyring_path: Path | str) -> KeyTrust:
    """What an edge trusts now: its configured keys, moved on by the rotations it accepted and kept in
    ``keyring_path``. Only rotations that verified are written there, so one that does not verify now was changed on
    disk: that is logged, and the configured keys are trusted."""
    configured_trust = KeyTrust.configured(configured)
    try:
        return configured_trust.follow(load_keyring(keyring_path))
    except KeyRotationError as err:
        log.error("the key rotations in %s do not verify (%s); trusting the configured keys", keyring_path, err)
        return configured_trust


def load_keyring(path: Path | str) -> list[KeyRotation]:
    """The rotation chain in a ``keyring.json``; an empty chain when there is no such file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return sorted(_KEYRING.validate_json(raw), key=lambda r: r.version)
    except ValidationError as err:
        raise KeyRotationError(f"{path} is not a key rotation chain: {err.errors()[0]['msg']}") from None


def save_keyring(path: Path | str, keyring: Sequence[KeyRotation]) -> None:
    """Write the chain atomically: a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(_KEYRING.dump_json(list(keyring), indent=1) + b"\n")
    os.chmod(temp, 0o644)  # public statements; mkstemp makes them private
    os.replace(temp, path)


# --- releases ------------------------------------------------------------------------------------------------------


def verify_release_statement(release: ModelRelease, trusted_keys: TrustedKeys) -> None:
    """Return if the release message is signed as a whole by a trusted key; else raise :class:`SignatureError`."""
    if release.release_signature is None or release.release_key_id is None:
        raise SignatureError(
            f"release {release.model_name} {release.version} is not signed: it has no release_signature"
        )
    try:
        verify(release_statement(release), release.release_signature, release.release_key_id, trusted_keys)
    except SignatureError as err:
        raise SignatureError(f"release {release.model_name} {release.version}: {err}") from None


def check_not_expired(release: ModelRelease, now: datetime | None = None) -> None:
    """Raise :class:`ExpiredReleaseError` unless the release carries an expiry that has not passed."""
    now = now or datetime.now(UTC)
    if release.expires_at is None:
        raise ExpiredReleaseError(f"release {release.model_name} {release.version} has no expires_at")
    if release.expires_at <= now:
        raise ExpiredReleaseError(
            f"release {release.model_name} {release.version} expired at {release.expires_at.isoformat()} "
            f"(issued {release.released_at.isoformat()}, now {now.isoformat()}): a stale or frozen feed"
        )


class ReleaseSigner:
    """Signs releases for publishing: stamps when each was issued and when it expires, attaches the key rotation
    chain, and signs the whole message. Issue times rise strictly, so releases one signer makes are always ordered.
    The private key never appears in a repr or a message, only its ``key_id``."""

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        keyring: Sequence[KeyRotation] = (),
        validity: timedelta = DEFAULT_RELEASE_VALIDITY,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if validity <= timedelta(0):
            raise ValueError(f"release validity {validity} must be positive")
        self._private_key = private_key
        self.key_id = key_id(private_key.public_key())
        self.keyring = sorted(keyring, key=lambda r: r.version)
        if self.keyring and self.key_id not in self.keyring[-1].keys:
            raise KeyRotationError(
                f"signing key {self.key_id} is not in the latest trust (version {self.keyring[-1].version}: "
                f"{', '.join(sorted(self.keyring[-1].keys))}): edges that follow the chain would refuse its releases"
            )
        self.validity = validity
        self._clock = clock
        self._last_issued: datetime | None = None

    @classmethod
    def from_key_file(cls, path: Path | str, validity: timedelta = DEFAULT_RELEASE_VALIDITY) -> ReleaseSigner:
        """The private key in ``path``, with the rotation chain in ``keyring.json`` beside it (if there is one)."""
        path = Path(path)
        return cls(load_private_key(path), load_keyring(path.parent / KEYRING_FILE), validity)

    def __repr__(self) -> str:
        return f"ReleaseSigner(key_id={self.key_id!r}, validity={self.validity}, rotations={len(self.keyring)})"

    def sign(self, release: ModelRelease) -> ModelRelease:
        issued = self._clock().astimezone(UTC)  # as the wire form will read back, or the signature would not match
        if self._last_issued is not None and issued <= self._last_issued:
            issued = self._last_issued + timedelta(microseconds=1)
        self._last_issued = issued
        unsigned = release.model_copy(
            update={
                "released_at": issued,
                "expires_at": issued + self.validity,
                "keyring": list(self.keyring),
                "release_key_id": self.key_id,
                "release_signature": None,
            }
        )
        return unsigned.model_copy(update={"release_signature": sign(release_statement(unsigned), self._private_key)})

    __call__ = sign
