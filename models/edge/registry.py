"""Signed model artifacts and the registry folder that holds their versions.

An artifact is a folder: the ONNX model, the tokenizer files, ``precursor.json``, ``metrics.json``, and
``manifest.json`` listing the sha256 and size of every other file, signed with ed25519 in ``manifest.sig``.
Verification trusts nothing it has not checked: the signature over the manifest's exact bytes first, then that the
folder holds exactly the files the manifest lists (none missing, none added), each with its listed size and hash.

A registry is ``ROOT/<model_name>/<version>/`` plus a ``champion.json`` pointer per model name. Published versions are
immutable. Updates travel as one file: :func:`pack` writes a tar, :func:`unpack` extracts it refusing anything that
could land outside the destination, and :func:`release_for` / :func:`verify_release` tie an artifact to the
:class:`~precursor.contracts.messages.ModelRelease` announced to the fleet.

This module imports no torch: the edge uses it to check what it is about to load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, field_validator

from models.edge.signing import SignatureError, TrustedKeys, key_id, sign, verify
from precursor.contracts.messages import ContractError, Identifier, ModelRelease, Sha256Hex, UtcDatetime, validate
from precursor.contracts.versions import version_key

CONFIG_FILE = "precursor.json"
"""The model's own description (horizon, threshold, calibration, how to read the ONNX graph): in a checkpoint folder
and in the artifact exported from it."""
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
CHAMPION_FILE = "champion.json"
ARTIFACT_FORMAT = "precursor-artifact/1"
DEFAULT_MODEL_NAME = "precursor-lm"
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+\-]{0,63}$"
_VERSION = re.compile(VERSION_PATTERN)
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")  # precursor.contracts.messages.Identifier
_HASH_CHUNK = 1 << 20

Version = Annotated[str, Field(pattern=VERSION_PATTERN)]
"""A model version: also a folder name, so no slashes and no leading dot."""


class ArtifactError(ValueError):
    """An artifact that cannot be trusted or used. Subclasses say which way it failed."""


class UnsignedArtifactError(ArtifactError):
    """No manifest or no signature: nothing vouches for the files."""


class TamperedArtifactError(ArtifactError):
    """The files differ from what the signed manifest lists: a changed byte, a missing file or an added one."""


class ArtifactNotFoundError(LookupError):
    """A version the registry does not hold."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Sha256Hex
    size: NonNegativeInt


class ArtifactManifest(BaseModel):
    """What ``manifest.json`` holds: the artifact's identity and every file it is made of."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["precursor-artifact/1"] = ARTIFACT_FORMAT
    model_name: Identifier
    version: Version
    created_at: UtcDatetime
    files: dict[str, FileEntry] = Field(min_length=1)

    @field_validator("files")
    @classmethod
    def _safe_names(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            problem = unsafe_member_name(name)
            if problem:
                raise ValueError(f"file name {name!r} {problem}")
            if name in (MANIFEST_FILE, SIGNATURE_FILE):
                raise ValueError(f"file name {name!r} is reserved for the manifest and its signature")
        return files

    @property
    def size_bytes(self) -> int:
        """Total size of the files the manifest lists (the manifest and signature not included)."""
        return sum(entry.size for entry in self.files.values())


class ManifestSignature(BaseModel):
    """What ``manifest.sig`` holds: who signed the manifest, and the base64 signature of its exact bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["ed25519"] = "ed25519"
    key_id: Identifier
    signature: str = Field(min_length=1)


# --- hashing and listing -------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _artifact_files(artifact_dir: Path) -> Iterator[tuple[str, Path]]:
    """(relative posix name, path) of every file under ``artifact_dir`` except the manifest and its signature."""
    for path in sorted(artifact_dir.rglob("*")):
        name = path.relative_to(artifact_dir).as_posix()
        if path.is_symlink():
            raise TamperedArtifactError(
                f"artifact {artifact_dir}: {name} is a symbolic link; artifacts hold files only"
            )
        if path.is_dir():
            continue
        if not path.is_file():
            raise TamperedArtifactError(f"artifact {artifact_dir}: {name} is not a regular file")
        if name in (MANIFEST_FILE, SIGNATURE_FILE):
            continue
        yield name, path


def unsafe_member_name(name: str) -> str | None:
    """Why ``name`` cannot be a file inside an artifact or archive, or None if it can."""
    if not name or "\x00" in name or "\\" in name:
        return "is empty or holds a NUL or backslash"
    pure = PurePosixPath(name)
    if pure.is_absolute():
        return "is an absolute path"
    if any(part in ("..", ".", "") for part in name.split("/")):
        return "has an empty, '.' or '..' component"
    return None


# --- signing and verifying -----------------------------------------------------------------------------------------


def sign_artifact(
    artifact_dir: Path | str,
    *,
    model_name: str,
    version: str,
    private_key: Ed25519PrivateKey,
    created_at: datetime | None = None,
) -> ArtifactManifest:
    """Hash every file in ``artifact_dir``, write ``manifest.json`` and sign it into ``manifest.sig``."""
    artifact_dir = Path(artifact_dir)
    files = {
        name: FileEntry(sha256=sha256_file(path), size=path.stat().st_size)
        for name, path in _artifact_files(artifact_dir)
    }
    try:
        manifest = validate(
            ArtifactManifest,
            {
                "model_name": model_name,
                "version": version,
                "created_at": created_at or datetime.now(UTC),
                "files": files,
            },
        )
    except ContractError as err:
        raise ArtifactError(f"cannot sign artifact {artifact_dir}: {err}") from None
    manifest_bytes = (manifest.model_dump_json(indent=2) + "\n").encode()
    signature = ManifestSignature(key_id=key_id(private_key.public_key()), signature=sign(manifest_bytes, private_key))
    (artifact_dir / MANIFEST_FILE).write_bytes(manifest_bytes)
    (artifact_dir / SIGNATURE_FILE).write_text(signature.model_dump_json(indent=2) + "\n")
    return manifest


def _read_signed(artifact_dir: Path) -> tuple[bytes, ManifestSignature]:
    manifest_path = artifact_dir / MANIFEST_FILE
    signature_path = artifact_dir / SIGNATURE_FILE
    if not artifact_dir.is_dir():
        raise ArtifactError(f"artifact {artifact_dir} is not a directory")
    if not manifest_path.is_file():
        raise UnsignedArtifactError(f"artifact {artifact_dir} has no {MANIFEST_FILE}: it is not a signed artifact")
    if not signature_path.is_file():
        raise UnsignedArtifactError(f"artifact {artifact_dir} is unsigned: {SIGNATURE_FILE} is missing")
    return manifest_path.read_bytes(), _parse_signature(signature_path.read_bytes(), str(signature_path))


def _parse_signature(raw: bytes, where: str) -> ManifestSignature:
    try:
        return ManifestSignature.model_validate_json(raw)
    except ValidationError as err:
        raise UnsignedArtifactError(f"{where} is not a valid signature file: {err.errors()[0]['msg']}") from None


def _parse_manifest(raw: bytes, where: str) -> ArtifactManifest:
    try:
        return ArtifactManifest.model_validate_json(raw)
    except ValidationError as err:
        raise ArtifactError(f"{where} is not a valid manifest: {err.errors()[0]['msg']}") from None


def verify_artifact(artifact_dir: Path | str, trusted_keys: TrustedKeys) -> ArtifactManifest:
    """Check signature, file list, sizes and hashes; return the manifest, or raise naming the first thing wrong.

    Raises :class:`UnsignedArtifactError`, :class:`~models.edge.signing.SignatureError` (bad signature, unknown key) or
    :class:`TamperedArtifactError` (a file changed, missing or added).
    """
    artifact_dir = Path(artifact_dir)
    manifest_bytes, signature = _read_signed(artifact_dir)
    try:
        verify(manifest_bytes, signature.signature, signature.key_id, trusted_keys)
    except SignatureError as err:
        raise SignatureError(f"artifact {artifact_dir}: {err}") from None
    manifest = _parse_manifest(manifest_bytes, str(artifact_dir / MANIFEST_FILE))

    present = dict(_artifact_files(artifact_dir))
    missing = sorted(set(manifest.files) - set(present))
    if missing:
        raise TamperedArtifactError(f"artifact {artifact_dir}: file(s) listed in the manifest are missing: {missing}")
    added = sorted(set(present) - set(manifest.files))
    if added:
        raise TamperedArtifactError(f"artifact {artifact_dir}: file(s) not in the signed manifest were added: {added}")
    for name, entry in manifest.files.items():
        path = present[name]
        size = path.stat().st_size
        if size != entry.size:
            raise TamperedArtifactError(
                f"artifact {artifact_dir}: {name} is {size} bytes, the signed manifest says {entry.size}"
            )
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise TamperedArtifactError(
                f"artifact {artifact_dir}: {name} has sha256 {digest}, the signed manifest says {entry.sha256}"
            )
    return manifest


def read_verified_file(artifact_dir: Path | str, name: str, manifest: ArtifactManifest) -> bytes:
    """The bytes of one artifact file, checked against the manifest as they are read.

    Loaders hand these very bytes to their parser, so a file swapped after :func:`verify_artifact` ran is caught.
    """
    entry = manifest.files.get(name)
    if entry is None:
        raise TamperedArtifactError(f"artifact {artifact_dir}: {name} is not listed in the signed manifest")
    data = (Path(artifact_dir) / name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise TamperedArtifactError(
            f"artifact {artifact_dir}: {name} has sha256 {digest}, the signed manifest says {entry.sha256}"
        )
    return data


# --- one file for transport ----------------------------------------------------------------------------------------


def pack(artifact_dir: Path | str, archive_path: Path | str) -> Path:
    """Write the artifact as one tar file (gzip-compressed if the name ends in ``.gz`` or ``.tgz``).

    Entries are sorted with fixed owners and times, so one artifact always packs to the same bytes.
    """
    artifact_dir = Path(artifact_dir)
    archive_path = Path(archive_path)
    _read_signed(artifact_dir)  # refuse to ship something nobody signed
    names = [MANIFEST_FILE, SIGNATURE_FILE] + [name for name, _ in _artifact_files(artifact_dir)]
    mode = "w:gz" if archive_path.name.endswith((".gz", ".tgz")) else "w"
    partial = archive_path.with_name(archive_path.name + ".partial")
    with tarfile.open(partial, mode, format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = (artifact_dir / name).stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with (artifact_dir / name).open("rb") as f:
                tar.addfile(info, f)
    partial.replace(archive_path)
    return archive_path


def _checked_members(tar: tarfile.TarFile, archive_path: Path, max_bytes: int, max_files: int) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    if len(members) > max_files:
        raise ArtifactError(f"archive {archive_path} holds {len(members)} entries, more than max_files={max_files}")
    seen: set[str] = set()
    total = 0
    for member in members:
        name = member.name.rstrip("/") if member.isdir() else member.name
        problem = unsafe_member_name(name)
        if problem:
            raise ArtifactError(f"archive {archive_path}: entry {member.name!r} {problem}; refusing to unpack")
        if not (member.isfile() or member.isdir()):
            raise ArtifactError(
                f"archive {archive_path}: entry {member.name!r} is a link or special file; artifacts hold files only"
            )
        if name in seen:
            raise ArtifactError(f"archive {archive_path}: entry {member.name!r} appears twice")
        seen.add(name)
        total += member.size
        if total > max_bytes:
            raise ArtifactError(f"archive {archive_path} unpacks to more than max_bytes={max_bytes}")
    return members


def _open_archive(archive_path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive_path, "r:*")
    except (tarfile.TarError, OSError) as err:
        raise ArtifactError(f"archive {archive_path} cannot be read as a tar file: {err}") from None


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path, archive_path: Path) -> None:
    target = staging / member.name
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    if source is None:
        raise ArtifactError(f"archive {archive_path}: entry {member.name!r} has no data")
    # O_EXCL: never follow or overwrite anything already at the target.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with source, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out)


def unpack(
    archive_path: Path | str, dest_dir: Path | str, *, max_bytes: int = 1 << 30, max_files: int = 10_000
) -> Path:
    """Extract an archive made by :func:`pack` into ``dest_dir`` (which must not exist, or be empty).

    Refuses absolute names, ``..``, links, devices, duplicate names and archives larger than ``max_bytes``, before
    writing anything. Extraction goes to a sibling folder renamed into place at the end, so a failure leaves nothing
    half-written at ``dest_dir``. The result still has to pass :func:`verify_artifact` before anyone loads it.
    """
    archive_path = Path(archive_path)
    dest_dir = Path(dest_dir)
    if dest_dir.exists() and (not dest_dir.is_dir() or any(dest_dir.iterdir())):
        raise FileExistsError(f"unpack destination {dest_dir} exists and is not an empty directory")
    with staged_folder(dest_dir, "unpacking") as staging, _open_archive(archive_path) as tar:
        for member in _checked_members(tar, archive_path, max_bytes, max_files):
            _extract_member(tar, member, staging, archive_path)
    return dest_dir


@contextmanager
def staged_folder(dest: Path, doing: str) -> Iterator[Path]:
    """A fresh folder beside ``dest`` (``.NAME.DOING-…``) to build an artifact in, renamed to ``dest`` (which may be
    an empty folder) when the block ends and removed when it fails: ``dest`` is never seen half-written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{doing}-", dir=dest.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; an artifact is not a secret
    try:
        yield staging
        if dest.exists():
            dest.rmdir()
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --- releases: the message that announces an artifact to the fleet --------------------------------------------------


def _signed_bytes_of(artifact: Path) -> tuple[bytes, ManifestSignature, str]:
    """(manifest bytes, signature, where) from an artifact folder or a packed archive."""
    if artifact.is_dir():
        manifest_bytes, signature = _read_signed(artifact)
        return manifest_bytes, signature, str(artifact)
    try:
        with tarfile.open(artifact, "r:*") as tar:
            found: dict[str, bytes] = {}
            for name in (MANIFEST_FILE, SIGNATURE_FILE):
                try:
                    member = tar.extractfile(name)
                except KeyError:
                    member = None
                if member is None:
                    raise UnsignedArtifactError(f"archive {artifact} has no {name}: it is not a signed artifact")
                found[name] = member.read()
    except (tarfile.TarError, OSError) as err:
        raise ArtifactError(f"archive {artifact} cannot be read as a tar file: {err}") from None
    return found[MANIFEST_FILE], _parse_signature(found[SIGNATURE_FILE], f"{artifact}:{SIGNATURE_FILE}"), str(artifact)


def artifact_sha256(artifact_dir: Path | str) -> str:
    """The hash a release announces for an artifact and an edge reports it runs: the sha256 of its manifest's exact
    bytes, which pins every file through their hashes. Not a verification: see :func:`verify_release`."""
    return manifest_sha256((Path(artifact_dir) / MANIFEST_FILE).read_bytes())


def manifest_sha256(manifest_bytes: bytes) -> str:
    """:func:`artifact_sha256` of a manifest already read (from an object store, an archive)."""
    return hashlib.sha256(manifest_bytes).hexdigest()


def release_for(
    artifact: Path | str,
    *,
    artifact_uri: str | None = None,
    target: str = "fleet",
    canary_edges: Iterable[str] = (),
) -> ModelRelease:
    """The :class:`ModelRelease` announcing ``artifact`` (a folder or a packed archive).

    ``sha256`` is the hash of the manifest's exact bytes (which pins every file through their hashes), ``signature``
    and ``key_id`` are the manifest's, and ``size_bytes`` is the total size of the files the manifest lists: the edge
    uses it to bound a download and the unpacked size. ``artifact_uri`` defaults to the artifact's ``file://`` URI.

    The result is not signed yet: edges take a release only once a :class:`models.edge.releases.ReleaseSigner` has
    signed it as a whole, with its issue time and expiry, after its targeting is final.
    """
    artifact = Path(artifact)
    manifest_bytes, signature, where = _signed_bytes_of(artifact)
    manifest = _parse_manifest(manifest_bytes, f"{where}:{MANIFEST_FILE}")
    return validate(
        ModelRelease,
        {
            "version": manifest.version,
            "model_name": manifest.model_name,
            "sha256": manifest_sha256(manifest_bytes),
            "signature": signature.signature,
            "key_id": signature.key_id,
            "size_bytes": manifest.size_bytes,
            "artifact_uri": artifact_uri or artifact.resolve().as_uri(),
            "target": target,
            "canary_edges": list(canary_edges),
        },
    )


def verify_release(release: ModelRelease, artifact_dir: Path | str, trusted_keys: TrustedKeys) -> ArtifactManifest:
    """Check that ``artifact_dir`` is intact, signed by a trusted key, and exactly what ``release`` announces."""
    artifact_dir = Path(artifact_dir)
    manifest = verify_artifact(artifact_dir, trusted_keys)
    manifest_bytes = (artifact_dir / MANIFEST_FILE).read_bytes()
    digest = manifest_sha256(manifest_bytes)
    if digest != release.sha256:
        raise TamperedArtifactError(
            f"artifact {artifact_dir}: manifest sha256 {digest} does not match release sha256 {release.sha256}"
        )
    try:
        verify(manifest_bytes, release.signature, release.key_id, trusted_keys)
    except SignatureError as err:
        raise SignatureError(f"release {release.model_name} {release.version}: {err}") from None
    for field, announced, found in (
        ("model_name", release.model_name, manifest.model_name),
        ("version", release.version, manifest.version),
        ("size_bytes", release.size_bytes, manifest.size_bytes),
    ):
        if announced != found:
            raise TamperedArtifactError(
                f"artifact {artifact_dir}: {field}={found!r}, but the release says {announced!r}"
            )
    return manifest


# --- the registry folder -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryEntry:
    """One published version: where it lives and what its manifest says."""

    model_name: str
    version: str
    path: Path
    created_at: datetime
    key_id: str
    size_bytes: int


class ModelRegistry:
    """Signed artifacts of one model name under ``root/<model_name>/<version>/``, and which one is champion.

    :meth:`list` reads manifests only (cheap); :meth:`get`, :meth:`latest` and :meth:`champion` verify the artifact
    they return, so nothing handed out by the registry is tampered or unsigned.
    """

    def __init__(self, root: Path | str, trusted_keys: TrustedKeys, model_name: str = DEFAULT_MODEL_NAME) -> None:
        if not _MODEL_NAME.match(model_name):
            raise ValueError(
                f"model_name={model_name!r} is not a valid identifier (letters, digits, '_', '.', ':', '-')"
            )
        self.root = Path(root)
        self.model_name = model_name
        self.trusted_keys = trusted_keys

    @property
    def model_dir(self) -> Path:
        return self.root / self.model_name

    def _version_dir(self, version: str) -> Path:
        if not _VERSION.match(version):
            raise ValueError(f"version={version!r} does not match {VERSION_PATTERN}")
        return self.model_dir / version

    def holds(self, version: str) -> bool:
        """Whether anything (a published version, or one being published) takes ``version``'s place."""
        return self._version_dir(version).exists()

    def location_of(self, name: str) -> str:
        """Where a file beside the versions is, as messages name it."""
        return str(self.model_dir / name)

    def read_pointer(self, name: str) -> bytes | None:
        """A small file kept beside the versions (``champion.json``, ``rejected.json``); None when there is none."""
        try:
            return (self.model_dir / name).read_bytes()
        except FileNotFoundError:
            return None

    def write_pointer(self, name: str, data: bytes) -> None:
        """Write a file beside the versions atomically: readers see the old one or the new one, never half of one."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", dir=self.model_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, self.model_dir / name)

    def _verified_for_publishing(self, artifact_dir: Path) -> ArtifactManifest:
        """The artifact's manifest, once its signature and files check out and it is of this registry's model."""
        manifest = verify_artifact(artifact_dir, self.trusted_keys)
        if manifest.model_name != self.model_name:
            raise ArtifactError(
                f"artifact {artifact_dir} is model_name={manifest.model_name!r}; "
                f"this registry holds {self.model_name!r}"
            )
        return manifest

    def publish(self, artifact_dir: Path | str) -> RegistryEntry:
        """Copy a signed artifact in as a new version. Refuses tampered or unsigned artifacts and existing versions."""
        artifact_dir = Path(artifact_dir)
        manifest = self._verified_for_publishing(artifact_dir)
        destination = self._version_dir(manifest.version)
        if destination.exists():
            raise FileExistsError(f"{self.model_name} version {manifest.version} is already published at {destination}")
        with staged_folder(destination, "publishing") as staging:
            shutil.copytree(artifact_dir, staging, dirs_exist_ok=True)
            # Verify the copy, not just the source: the source could change between the check and the copy.
            verify_artifact(staging, self.trusted_keys)
        return self._entry(manifest.version)

    def _entry(self, version: str) -> RegistryEntry:
        path = self._version_dir(version)
        manifest_bytes, signature = _read_signed(path)
        manifest = _parse_manifest(manifest_bytes, str(path / MANIFEST_FILE))
        return RegistryEntry(
            model_name=manifest.model_name,
            version=manifest.version,
            path=path,
            created_at=manifest.created_at,
            key_id=signature.key_id,
            size_bytes=manifest.size_bytes,
        )

    def list(self) -> list[RegistryEntry]:
        """Published versions, oldest version first (:func:`precursor.contracts.versions.version_key`). Not verified:
        use
        :meth:`get`."""
        if not self.model_dir.is_dir():
            return []
        versions = [p.name for p in self.model_dir.iterdir() if p.is_dir() and _VERSION.match(p.name)]
        entries = [self._entry(v) for v in versions]
        return sorted(entries, key=lambda e: (version_key(e.version), e.created_at))

    def get(self, version: str) -> RegistryEntry:
        """A published version, verified against the trusted keys."""
        path = self._version_dir(version)
        if not path.is_dir():
            known = ", ".join(e.version for e in self.list()) or "none"
            raise ArtifactNotFoundError(f"{self.model_name} has no version {version!r} (published: {known})")
        verify_artifact(path, self.trusted_keys)
        return self._entry(version)

    def latest(self) -> RegistryEntry | None:
        """The highest published version, verified; None if nothing is published."""
        entries = self.list()
        return self.get(entries[-1].version) if entries else None

    def set_champion(self, version: str) -> None:
        """Point the champion at a published, verified version (atomically: readers never see a half-written file)."""
        self.get(version)
        pointer = {"version": version, "set_at": datetime.now(UTC).isoformat()}
        self.write_pointer(CHAMPION_FILE, json.dumps(pointer).encode())

    def champion(self) -> RegistryEntry | None:
        """The champion version, verified; None if no champion was set."""
        raw = self.read_pointer(CHAMPION_FILE)
        if raw is None:
            return None
        try:
            version = json.loads(raw)["version"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ArtifactError(f"champion pointer {self.location_of(CHAMPION_FILE)} is not valid: {err}") from None
        return self.get(str(version))
