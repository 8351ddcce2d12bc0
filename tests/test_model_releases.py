"""Release messages signed as a whole, their expiry, and key rotation: what the publisher signs is what the edge checks,
a change to any field breaks the signature, and trust moves only by a rotation the keys trusted now signed."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from models.edge.releases import (
    KEYRING_FILE,
    ExpiredReleaseError,
    KeyRotationError,
    KeyTrust,
    ReleaseSigner,
    check_not_expired,
    load_keyring,
    make_rotation,
    release_digest,
    release_statement,
    verify_release_statement,
)
from models.edge.signing import SignatureError, generate_keypair, key_id, load_private_key, load_public_keys
from precursor.contracts.messages import ModelRelease, decode, encode
from precursor.keys_cli import keys_command

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def release(version: str = "0.2.0", **more: object) -> ModelRelease:
    return ModelRelease(
        version=version,
        model_name="precursor-lm",
        sha256="a" * 64,
        signature="c2ln",
        key_id="0123456789abcdef",
        size_bytes=10,
        artifact_uri=f"file:///registry/precursor-lm/{version}",
        **more,  # type: ignore[arg-type]
    )


def trusted(*keys: Ed25519PrivateKey) -> dict:
    return {key_id(k.public_key()): k.public_key() for k in keys}


def test_a_signed_release_verifies_after_the_wire_and_every_field_is_covered() -> None:
    key = Ed25519PrivateKey.generate()
    signed = ReleaseSigner(key, validity=timedelta(days=30), clock=lambda: T0)(release(target="site-3"))
    assert signed.released_at == T0 and signed.expires_at == T0 + timedelta(days=30)
    received = decode(ModelRelease, encode(signed))
    verify_release_statement(received, trusted(key))
    changes: dict[str, object] = {
        "version": "0.1.0",
        "target": "fleet",
        "sha256": "b" * 64,
        "size_bytes": 11,
        "artifact_uri": "https://evil.example/m.tar",
        "released_at": T0 + timedelta(seconds=1),
        "expires_at": T0 + timedelta(days=3650),
        "canary_edges": ["edge-1"],
        "rollback": True,
        "signature": "b3RoZXI=",
        "key_id": "fedcba9876543210",
        "model_name": "other-lm",
    }
    for field, value in changes.items():
        tampered = received.model_copy(update={field: value})
        with pytest.raises(SignatureError, match="does not match the signed data"):
            verify_release_statement(tampered, trusted(key))
        assert release_digest(tampered) != release_digest(received), field


def test_unsigned_and_unknown_key_releases_are_refused_by_name() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    with pytest.raises(SignatureError, match="is not signed: it has no release_signature"):
        verify_release_statement(release(), trusted(key))
    with pytest.raises(SignatureError, match="not a trusted key"):
        verify_release_statement(ReleaseSigner(other)(release()), trusted(key))


def test_the_statement_is_tagged_and_leaves_out_only_the_release_signature() -> None:
    signed = ReleaseSigner(Ed25519PrivateKey.generate(), clock=lambda: T0)(release())
    statement = release_statement(signed)
    assert b'"statement":"precursor.model-release"' in statement
    assert signed.release_signature is not None and signed.release_signature.encode() not in statement
    assert b'"release_key_id"' in statement and b'"expires_at"' in statement


def test_issue_times_from_one_signer_rise_strictly_even_when_the_clock_does_not() -> None:
    signer = ReleaseSigner(Ed25519PrivateKey.generate(), clock=lambda: T0)
    first, second = signer(release()), signer(release())
    assert second.released_at > first.released_at


def test_expiry_is_checked_and_required() -> None:
    signed = ReleaseSigner(Ed25519PrivateKey.generate(), validity=timedelta(hours=1), clock=lambda: T0)(release())
    check_not_expired(signed, now=T0 + timedelta(minutes=59))
    with pytest.raises(ExpiredReleaseError, match=re.escape("expired at 2026-03-01T13:00:00+00:00")):
        check_not_expired(signed, now=T0 + timedelta(hours=1))
    with pytest.raises(ExpiredReleaseError, match="has no expires_at"):
        check_not_expired(release(), now=T0)
    with pytest.raises(ValueError, match="must be positive"):
        ReleaseSigner(Ed25519PrivateKey.generate(), validity=timedelta(0))


# --- key rotation ----------------------------------------------------------------------------------------------------


def test_a_rotation_needs_the_old_keys_threshold_and_the_new_keys_own_signatures() -> None:
    a, b, c, d = (Ed25519PrivateKey.generate() for _ in range(4))
    edge = KeyTrust.configured(trusted(a))
    # Two of three sign the next rotation from version 1 on.
    v1 = make_rotation([], [a.public_key(), b.public_key(), c.public_key()], signers=[a, b], threshold=2)
    assert edge.advance(v1).threshold == 2
    at_v1 = edge.follow([v1])
    v2_one = make_rotation([v1], [d.public_key()], signers=[a, d])
    with pytest.raises(KeyRotationError, match=r"signed by 1 of the keys trusted now .*, needs 2"):
        at_v1.advance(v2_one)
    v2_twice = v2_one.model_copy(update={"signatures": [*v2_one.signatures, v2_one.signatures[0]]})
    with pytest.raises(KeyRotationError, match="needs 2"):  # one key signing twice still counts once
        at_v1.advance(v2_twice)
    v2 = make_rotation([v1], [d.public_key()], signers=[b, c, d])
    at_v2 = edge.follow([v1, v2])
    assert set(at_v2.keys) == {key_id(d.public_key())} and at_v2.version == 2
    with pytest.raises(KeyRotationError, match="signed by 0 of the keys it names"):  # naming a key nobody holds
        at_v1.advance(make_rotation([v1], [d.public_key()], signers=[b, c]))
    with pytest.raises(KeyRotationError, match="does not follow trust version 0"):  # no skipping a version
        edge.advance(v2)
    assert edge.follow([v2, v1]).version == 2  # taken in version order, whatever order they came in
    assert at_v2.follow([v1]).version == 2  # older rotations are history, not a way back


def test_a_rotation_with_a_key_under_a_false_name_is_refused() -> None:
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    good = make_rotation([], [b.public_key()], signers=[a, b])
    (text,) = good.keys.values()
    renamed = good.model_copy(update={"keys": {key_id(a.public_key()): text}})
    with pytest.raises(KeyRotationError, match="is really"):
        KeyTrust.configured(trusted(a)).advance(renamed)


def test_a_signer_refuses_a_key_the_chain_it_carries_revoked() -> None:
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    chain = [make_rotation([], [b.public_key()], signers=[a, b])]
    with pytest.raises(KeyRotationError, match="not in the latest trust"):
        ReleaseSigner(a, chain)
    assert ReleaseSigner(b, chain)(release()).keyring == chain


def keys_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(keys_command)
    return app


def test_the_rotation_command_writes_a_chain_edges_follow_and_revokes_the_old_key(tmp_path: Path) -> None:
    old = generate_keypair(tmp_path / "keys", "release-1")
    edge = KeyTrust.configured(load_public_keys(old.public_key_path))
    runner = CliRunner()
    result = runner.invoke(
        keys_app(), [str(tmp_path / "keys"), "--name", "release-2", "--rotate-from", str(old.private_key_path)]
    )
    assert result.exit_code == 0, result.output
    new_id = next(iter(load_public_keys(tmp_path / "keys" / "release-2.pub")))
    assert f"revoked:     {old.key_id}" in result.output and "PRIVATE KEY" not in result.output
    chain = load_keyring(tmp_path / "keys" / KEYRING_FILE)
    assert [r.version for r in chain] == [1]
    after = edge.follow(chain)
    assert set(after.keys) == {new_id}
    signer = ReleaseSigner.from_key_file(tmp_path / "keys" / "release-2.key")
    verify_release_statement(signer(release()), edge.follow(signer(release()).keyring).keys)
    with pytest.raises(SignatureError, match="not a trusted key"):
        verify_release_statement(ReleaseSigner(load_private_key(old.private_key_path))(release()), after.keys)

    # A second rotation continues the chain from the key that signs now; the revoked one cannot sign it.
    refused = runner.invoke(
        keys_app(), [str(tmp_path / "keys"), "--name", "release-3", "--rotate-from", str(old.private_key_path)]
    )
    assert refused.exit_code == 1 and "needs 1 of its keys to sign a rotation" in refused.output
    assert not (tmp_path / "keys" / "release-3.key").exists()  # checked before any key is written
    again = runner.invoke(
        keys_app(),
        [str(tmp_path / "keys"), "--name", "release-3", "--rotate-from", str(tmp_path / "keys" / "release-2.key")],
    )
    assert again.exit_code == 0, again.output
    chain = load_keyring(tmp_path / "keys" / KEYRING_FILE)
    assert [r.version for r in chain] == [1, 2]
    assert set(edge.follow(chain).keys) == set(load_public_keys(tmp_path / "keys" / "release-3.pub"))


def test_keep_old_keeps_both_keys_trusted(tmp_path: Path) -> None:
    old = generate_keypair(tmp_path / "keys", "release-1")
    result = CliRunner().invoke(
        keys_app(),
        [str(tmp_path / "keys"), "--name", "release-2", "--rotate-from", str(old.private_key_path), "--keep-old"],
    )
    assert result.exit_code == 0, result.output
    after = KeyTrust.configured(load_public_keys(old.public_key_path)).follow(
        load_keyring(tmp_path / "keys" / KEYRING_FILE)
    )
    assert old.key_id in after.keys and len(after.keys) == 2 and "revoked:     none" in result.output
