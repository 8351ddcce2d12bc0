"""Signed artifacts, the registry folder, releases and one-file transport: tampering of any kind is refused."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models.edge.registry import (
    ArtifactError,
    ArtifactNotFoundError,
    ModelRegistry,
    TamperedArtifactError,
    UnsignedArtifactError,
    pack,
    release_for,
    sign_artifact,
    unpack,
    verify_artifact,
    verify_release,
)
from models.edge.signing import (
    KeyFileError,
    SignatureError,
    generate_keypair,
    load_private_key,
    load_public_keys,
    sign,
    verify,
)
from precursor.contracts.messages import ModelRelease, decode, encode
from precursor.keys_cli import keys_command


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    directory = tmp_path / "keys"
    generate_keypair(directory)
    return directory


def make_artifact(directory: Path, keys: Path, version: str = "1.0.0", model_name: str = "precursor-lm") -> Path:
    """An artifact's shape with stand-in content: the registry checks bytes, not what they mean."""
    directory.mkdir(parents=True)
    (directory / "model.onnx").write_bytes(os.urandom(4096))
    (directory / "tokenizer.json").write_text('{"vocab": {"<pad>": 0}}')
    (directory / "precursor.json").write_text(json.dumps({"horizon_h": 24, "threshold": 0.5}))
    (directory / "metrics.json").write_text("{}")
    sign_artifact(
        directory, model_name=model_name, version=version, private_key=load_private_key(keys / "precursor.key")
    )
    return directory


# --- signing and keys ---------------------------------------------------------------------------------------------


def test_generated_private_key_is_mode_0600_and_never_overwritten(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path)
    assert stat.S_IMODE(pair.private_key_path.stat().st_mode) == 0o600
    assert len(pair.key_id) == 16
    with pytest.raises(FileExistsError, match="never overwritten"):
        generate_keypair(tmp_path)


def test_signature_verifies_only_the_data_and_key_it_was_made_with(keys: Path, tmp_path: Path) -> None:
    trusted = load_public_keys(keys)
    (key_id,) = trusted
    signature = sign(b"payload", load_private_key(keys / "precursor.key"))
    verify(b"payload", signature, key_id, trusted)
    with pytest.raises(SignatureError, match="does not match"):
        verify(b"payload!", signature, key_id, trusted)
    with pytest.raises(SignatureError, match="not a trusted key"):
        verify(b"payload", signature, "0123456789abcdef", trusted)
    with pytest.raises(SignatureError, match="not valid base64"):
        verify(b"payload", "not base64 at all!", key_id, trusted)
    other = generate_keypair(tmp_path / "other")
    forged = sign(b"payload", load_private_key(other.private_key_path))
    with pytest.raises(SignatureError, match="does not match"):
        verify(b"payload", forged, key_id, trusted)


def test_key_files_of_the_wrong_kind_are_named_in_the_error(keys: Path, tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=re.escape("precursor.pub")):
        load_private_key(keys / "precursor.pub")
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(KeyFileError, match=re.escape("junk.pub is not a PEM public key")):
        load_public_keys([tmp_path / "junk.pub"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match=re.escape("no *.pub")):
        load_public_keys(tmp_path / "empty")


def test_keys_command_creates_a_pair_and_never_prints_the_private_key(tmp_path: Path) -> None:
    import typer

    app = typer.Typer()
    app.command()(keys_command)
    result = CliRunner().invoke(app, [str(tmp_path / "k"), "--name", "fleet"])
    assert result.exit_code == 0, result.output
    private_pem = (tmp_path / "k" / "fleet.key").read_text()
    body = "".join(private_pem.splitlines()[1:-1])
    assert body and body not in result.output
    assert "PRIVATE KEY" not in result.output
    assert stat.S_IMODE((tmp_path / "k" / "fleet.key").stat().st_mode) == 0o600
    assert next(iter(load_public_keys(tmp_path / "k"))) in result.output
    again = CliRunner().invoke(app, [str(tmp_path / "k"), "--name", "fleet"])
    assert again.exit_code == 1
    assert (tmp_path / "k" / "fleet.key").read_text() == private_pem


# --- verifying artifacts ------------------------------------------------------------------------------------------


def test_an_intact_artifact_verifies(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    manifest = verify_artifact(artifact, load_public_keys(keys))
    assert (manifest.model_name, manifest.version) == ("precursor-lm", "1.0.0")
    assert set(manifest.files) == {"model.onnx", "tokenizer.json", "precursor.json", "metrics.json"}


@pytest.mark.parametrize("name", ["model.onnx", "tokenizer.json", "precursor.json", "metrics.json"])
def test_one_changed_byte_in_any_file_is_refused(keys: Path, tmp_path: Path, name: str) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    data = bytearray((artifact / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (artifact / name).write_bytes(bytes(data))
    with pytest.raises(TamperedArtifactError, match=f"{name} has sha256"):
        verify_artifact(artifact, load_public_keys(keys))


def test_a_missing_file_is_refused(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    (artifact / "tokenizer.json").unlink()
    with pytest.raises(TamperedArtifactError, match=r"missing: \['tokenizer.json'\]"):
        verify_artifact(artifact, load_public_keys(keys))


@pytest.mark.parametrize("extra", ["extra.py", "sub/evil.onnx"])
def test_an_added_file_is_refused(keys: Path, tmp_path: Path, extra: str) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    (artifact / extra).parent.mkdir(exist_ok=True)
    (artifact / extra).write_text("import os")
    with pytest.raises(TamperedArtifactError, match=f"added: \\['{extra}'\\]"):
        verify_artifact(artifact, load_public_keys(keys))


def test_a_symlink_in_place_of_a_file_is_refused(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    shutil.move(artifact / "metrics.json", tmp_path / "metrics.json")
    (artifact / "metrics.json").symlink_to(tmp_path / "metrics.json")
    with pytest.raises(TamperedArtifactError, match="symbolic link"):
        verify_artifact(artifact, load_public_keys(keys))


def test_an_edited_manifest_breaks_the_signature(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["version"] = "9.9.9"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SignatureError, match="does not match the signed data"):
        verify_artifact(artifact, load_public_keys(keys))


def test_a_resigned_artifact_by_an_untrusted_key_is_refused(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    (artifact / "model.onnx").write_bytes(b"evil model")
    stranger = generate_keypair(tmp_path / "stranger")
    sign_artifact(
        artifact, model_name="precursor-lm", version="1.0.0", private_key=load_private_key(stranger.private_key_path)
    )
    with pytest.raises(SignatureError, match=f"key_id='{stranger.key_id}', which is not a trusted key"):
        verify_artifact(artifact, load_public_keys(keys))


def test_an_unsigned_artifact_is_refused(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    (artifact / "manifest.sig").unlink()
    with pytest.raises(UnsignedArtifactError, match=re.escape("unsigned: manifest.sig is missing")):
        verify_artifact(artifact, load_public_keys(keys))
    (artifact / "manifest.json").unlink()
    with pytest.raises(UnsignedArtifactError, match=re.escape("no manifest.json")):
        verify_artifact(artifact, load_public_keys(keys))


def test_a_garbled_signature_file_is_refused(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys)
    (artifact / "manifest.sig").write_text("{}")
    with pytest.raises(UnsignedArtifactError, match="not a valid signature file"):
        verify_artifact(artifact, load_public_keys(keys))


# --- the registry -------------------------------------------------------------------------------------------------


def test_registry_publishes_lists_gets_and_orders_versions(keys: Path, tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(keys))
    assert registry.list() == []
    assert registry.latest() is None
    assert registry.champion() is None
    for version in ("0.9.0", "0.10.0", "0.9.1"):
        entry = registry.publish(make_artifact(tmp_path / f"build-{version}", keys, version))
        assert entry.path == tmp_path / "registry" / "precursor-lm" / version
    assert [e.version for e in registry.list()] == ["0.9.0", "0.9.1", "0.10.0"]
    latest = registry.latest()
    assert latest is not None and latest.version == "0.10.0"
    assert registry.get("0.9.1").key_id == next(iter(load_public_keys(keys)))
    with pytest.raises(ArtifactNotFoundError, match=r"no version '2\.0\.0'.*0\.9\.0, 0\.9\.1, 0\.10\.0"):
        registry.get("2.0.0")


def test_registry_champion_pointer(keys: Path, tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(keys))
    registry.publish(make_artifact(tmp_path / "b1", keys, "1.0.0"))
    registry.publish(make_artifact(tmp_path / "b2", keys, "1.1.0"))
    registry.set_champion("1.0.0")
    champion = registry.champion()
    assert champion is not None and champion.version == "1.0.0"
    with pytest.raises(ArtifactNotFoundError):
        registry.set_champion("3.0.0")
    assert registry.champion().version == "1.0.0"  # type: ignore[union-attr]


def test_registry_refuses_tampered_unsigned_duplicate_and_foreign_artifacts(keys: Path, tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(keys))
    good = make_artifact(tmp_path / "good", keys, "1.0.0")
    registry.publish(good)
    with pytest.raises(FileExistsError, match="already published"):
        registry.publish(good)
    tampered = make_artifact(tmp_path / "tampered", keys, "1.0.1")
    (tampered / "model.onnx").write_bytes(b"x")
    with pytest.raises(TamperedArtifactError):
        registry.publish(tampered)
    unsigned = make_artifact(tmp_path / "unsigned", keys, "1.0.2")
    (unsigned / "manifest.sig").unlink()
    with pytest.raises(UnsignedArtifactError):
        registry.publish(unsigned)
    with pytest.raises(ArtifactError, match="model_name='other-model'"):
        registry.publish(make_artifact(tmp_path / "other", keys, "1.0.3", model_name="other-model"))
    assert [e.version for e in registry.list()] == ["1.0.0"]
    assert not [p for p in (tmp_path / "registry" / "precursor-lm").iterdir() if p.name.startswith(".")]


def test_registry_get_refuses_an_artifact_tampered_after_publishing(keys: Path, tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(keys))
    entry = registry.publish(make_artifact(tmp_path / "b", keys, "1.0.0"))
    (entry.path / "metrics.json").write_text('{"pr_auc": 0.99}')
    with pytest.raises(TamperedArtifactError, match=re.escape("metrics.json")):
        registry.get("1.0.0")
    with pytest.raises(TamperedArtifactError):
        registry.latest()


def test_registry_rejects_versions_that_are_not_folder_names(keys: Path, tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(keys))
    with pytest.raises(ValueError, match=re.escape("version='../x'")):
        registry.get("../x")
    with pytest.raises(ArtifactError, match="version"):
        make_artifact(tmp_path / "bad", keys, "../../etc")


# --- releases -----------------------------------------------------------------------------------------------------


def test_release_describes_the_artifact_and_verifies_against_it(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys, "2.0.0")
    release = release_for(artifact, artifact_uri="s3://models/precursor-lm/2.0.0.tar")
    assert decode(ModelRelease, encode(release)) == release
    assert (release.version, release.model_name, release.key_id) == (
        "2.0.0",
        "precursor-lm",
        next(iter(load_public_keys(keys))),
    )
    assert release.size_bytes == sum(p.stat().st_size for p in artifact.iterdir() if not p.name.startswith("manifest"))
    manifest = verify_release(release, artifact, load_public_keys(keys))
    assert manifest.version == "2.0.0"


def test_release_refuses_an_artifact_it_does_not_announce(keys: Path, tmp_path: Path) -> None:
    trusted = load_public_keys(keys)
    release = release_for(make_artifact(tmp_path / "a", keys, "2.0.0"))
    other = make_artifact(tmp_path / "b", keys, "2.0.0")  # same version, different bytes: still not this release
    with pytest.raises(TamperedArtifactError, match="does not match release sha256"):
        verify_release(release, other, trusted)
    forged = release.model_copy(update={"signature": release_for(other).signature})
    with pytest.raises(SignatureError, match=re.escape("release precursor-lm 2.0.0")):
        verify_release(forged, tmp_path / "a", trusted)


def test_a_release_is_unsigned_until_a_release_signer_signs_it_and_then_verifies_off_the_wire(
    keys: Path, tmp_path: Path
) -> None:
    from models.edge.releases import ReleaseSigner, verify_release_statement

    trusted = load_public_keys(keys)
    artifact = make_artifact(tmp_path / "a", keys, "2.0.0")
    unsigned = release_for(artifact, target="site-1")
    with pytest.raises(SignatureError, match="is not signed"):
        verify_release_statement(unsigned, trusted)
    signed = ReleaseSigner.from_key_file(keys / "precursor.key")(unsigned)
    received = decode(ModelRelease, encode(signed))
    verify_release_statement(received, trusted)
    verify_release(received, artifact, trusted)  # the artifact checks are unchanged by the release signature


# --- one file for transport ---------------------------------------------------------------------------------------


def test_pack_unpack_round_trip_keeps_the_artifact_verifiable(keys: Path, tmp_path: Path) -> None:
    artifact = make_artifact(tmp_path / "a", keys, "3.0.0")
    archive = pack(artifact, tmp_path / "a.tar")
    assert pack(artifact, tmp_path / "again.tar").read_bytes() == archive.read_bytes()  # reproducible
    from_archive = release_for(archive)
    assert from_archive.sha256 == release_for(artifact).sha256
    unpacked = unpack(archive, tmp_path / "edge" / "3.0.0")
    verify_release(from_archive, unpacked, load_public_keys(keys))
    gz = unpack(pack(artifact, tmp_path / "a.tar.gz"), tmp_path / "edge" / "gz")
    verify_artifact(gz, load_public_keys(keys))


def _tar_with(path: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w") as tar:
        for info in members:
            if info.isfile():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_entry("../escape.txt"), "'..' component"),
        (_entry("a/../../escape.txt"), "'..' component"),
        (_entry("/etc/evil"), "absolute path"),
        (_entry("link", tarfile.SYMTYPE, "/etc/passwd"), "link or special file"),
        (_entry("hard", tarfile.LNKTYPE, "manifest.json"), "link or special file"),
        (_entry("fifo", tarfile.FIFOTYPE), "link or special file"),
    ],
)
def test_unpack_refuses_entries_that_could_escape_or_are_not_files(
    tmp_path: Path, entry: tarfile.TarInfo, reason: str
) -> None:
    archive = _tar_with(tmp_path / "evil.tar", [_entry("manifest.json"), entry])
    with pytest.raises(ArtifactError, match=reason):
        unpack(archive, tmp_path / "out" / "dest")
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "out" / "dest").exists()
    assert list((tmp_path / "out").iterdir()) == []  # the staging folder is gone too


def test_unpack_refuses_duplicates_oversized_archives_and_busy_destinations(tmp_path: Path) -> None:
    twice = _tar_with(tmp_path / "twice.tar", [_entry("model.onnx"), _entry("model.onnx")])
    with pytest.raises(ArtifactError, match="appears twice"):
        unpack(twice, tmp_path / "d1")
    big = _tar_with(tmp_path / "big.tar", [_entry("model.onnx")], data=b"x" * 2048)
    with pytest.raises(ArtifactError, match="max_bytes=1024"):
        unpack(big, tmp_path / "d2", max_bytes=1024)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep").write_text("x")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        unpack(big, tmp_path / "busy")
    (tmp_path / "junk.tar").write_bytes(b"not a tar file at all")
    with pytest.raises(ArtifactError, match="cannot be read as a tar file"):
        unpack(tmp_path / "junk.tar", tmp_path / "d3")
