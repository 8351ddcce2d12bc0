"""The model registry on object storage: the layout of a local registry (``URL/<model_name>/<version>/`` and
``champion.json``) under an fsspec URL such as ``s3://bucket/registry``.

An object store has no rename, so :meth:`ObjectStoreRegistry.publish` uploads a version's files first and its
``manifest.json`` last: a version is listed only once its manifest is there, and what a publish that died half-way
left is cleared by the next one. A pointer (``champion.json``, ``rejected.json``) is one PUT, which S3 makes atomic.

Nothing is trusted for being in the bucket. :meth:`~ObjectStoreRegistry.get` downloads the version and verifies it
(signature, file list, sizes, hashes) before it keeps it as a local copy, and ``RegistryEntry.path`` names that
verified copy, so whatever loads or announces a model works on local files as with a local registry. The copies live
under ``cache_dir`` (default ``<state_dir>/cache/registry``), which ``root`` and ``model_dir`` name here.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.edge.registry import (
    _VERSION,
    DEFAULT_MODEL_NAME,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ArtifactError,
    ArtifactNotFoundError,
    ModelRegistry,
    RegistryEntry,
    _parse_manifest,
    _parse_signature,
    unsafe_member_name,
    verify_artifact,
)
from models.edge.signing import SignatureError, TrustedKeys
from precursor.contracts.object_store import ObjectStoreSettings, explained, filesystem, is_url
from precursor.contracts.settings import PrecursorSettings
from precursor.contracts.versions import version_key

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem


def open_registry(
    location: Path | str,
    trusted_keys: TrustedKeys,
    model_name: str = DEFAULT_MODEL_NAME,
    *,
    settings: ObjectStoreSettings | None = None,
    cache_dir: Path | None = None,
) -> ModelRegistry:
    """The registry at ``location``: a local folder, or an object store URL (``s3://bucket/registry``)."""
    if is_url(location):
        return ObjectStoreRegistry(str(location), trusted_keys, model_name, settings=settings, cache_dir=cache_dir)
    return ModelRegistry(location, trusted_keys, model_name)


def version_objects(
    url: str, names: Iterable[str], settings: ObjectStoreSettings | None = None
) -> tuple[AbstractFileSystem, str, dict[str, dict[str, Any]]]:
    """The objects ``ROOT/<model_name>/<version>/<name>`` of a registry at ``url``, for each of ``names``, listed
    afresh: ``(filesystem, root, key -> the store's info on it)``. For readers that want a few small files of every
    version (manifests, ``precursor.json``) without a registry object per model name. Raises ``FileNotFoundError``
    naming ``url`` where nothing is stored under it."""
    fs, root = filesystem(url, settings)
    root = root.rstrip("/")
    fs.invalidate_cache()  # a listing cached earlier would miss versions published since
    found = fs.find(root, detail=True)
    if not found:
        raise FileNotFoundError(f"model registry {url} holds nothing")
    wanted = "|".join(re.escape(name) for name in names)
    pattern = re.compile(rf"[^/]+/[^/]+/(?:{wanted})")
    return fs, root, {key: info for key, info in found.items() if pattern.fullmatch(key[len(root) + 1 :])}


def download_objects(fs: AbstractFileSystem, prefix: str, keys: Iterable[str], target: Path, where: str) -> None:
    """Copies the objects ``keys`` (all under ``prefix/``) into ``target``, each at its path below the prefix. A key
    whose rest is no safe file name (``..``, absolute, empty part) is refused with :class:`ArtifactError` before
    anything is written for it, so a bucket cannot place a file outside ``target``; ``where`` starts that message."""
    for key in sorted(keys):
        name = key[len(prefix) + 1 :]
        problem = unsafe_member_name(name)
        if problem:
            raise ArtifactError(f"{where}: object {name!r} {problem}")
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(key, str(target / name))


class ObjectStoreRegistry(ModelRegistry):
    """A :class:`~models.edge.registry.ModelRegistry` whose versions and pointers live at ``url``; see the module
    text.
    """

    def __init__(
        self,
        url: str,
        trusted_keys: TrustedKeys,
        model_name: str = DEFAULT_MODEL_NAME,
        *,
        settings: ObjectStoreSettings | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        if cache_dir is None:
            cache_dir = PrecursorSettings().state_dir / "cache" / "registry"
        # One cache folder per registry URL: two registries never share a local copy.
        super().__init__(cache_dir / hashlib.sha256(self.url.encode()).hexdigest()[:16], trusted_keys, model_name)
        self._settings = settings
        self._fs, self._path = filesystem(self.url, settings)

    def __repr__(self) -> str:
        return f"ObjectStoreRegistry({self.url!r}, model_name={self.model_name!r})"

    def _remote(self, *parts: str) -> str:
        return "/".join([self._path.rstrip("/"), self.model_name, *parts])

    def location_of(self, name: str) -> str:
        return f"{self.url}/{self.model_name}/{name}"

    # --- pointers --------------------------------------------------------------------------------------------------

    def read_pointer(self, name: str) -> bytes | None:
        try:
            return self._fs.cat_file(self._remote(name))
        except FileNotFoundError:
            return None

    def write_pointer(self, name: str, data: bytes) -> None:
        with explained(self.url, self._settings):  # a key that may read but not write: one error naming the URL
            self._fs.pipe_file(self._remote(name), data)

    # --- versions --------------------------------------------------------------------------------------------------

    def holds(self, version: str) -> bool:
        self._version_dir(version)  # a valid version name, or ValueError
        return bool(self._fs.find(self._remote(version)))  # find lists the keys afresh

    def publish(self, artifact_dir: Path | str) -> RegistryEntry:
        """Upload a signed artifact as a new version (its manifest last), then download and verify what landed.
        Refuses tampered or unsigned artifacts and versions already published."""
        with explained(self.url, self._settings):  # a key that may read but not write: one error naming the URL
            return self._publish(Path(artifact_dir))

    def _publish(self, artifact_dir: Path) -> RegistryEntry:
        manifest = self._verified_for_publishing(artifact_dir)
        self._version_dir(manifest.version)
        remote = self._remote(manifest.version)
        present = self._fs.find(remote)
        if f"{remote}/{MANIFEST_FILE}" in present:
            raise FileExistsError(
                f"{self.model_name} version {manifest.version} is already published at "
                f"{self.location_of(manifest.version)}"
            )
        if present:  # what a publish that died before its manifest left
            self._fs.rm(present)
        for name in [*sorted(manifest.files), SIGNATURE_FILE, MANIFEST_FILE]:
            self._fs.put_file(str(artifact_dir / name), f"{remote}/{name}")
        try:
            # Verify what the store holds, not just the source: the source could change between the check and the copy.
            return self.get(manifest.version)
        except (ArtifactError, SignatureError):
            self._fs.rm(f"{remote}/{MANIFEST_FILE}")  # unlisted first, then the rest
            self._fs.rm(self._fs.find(remote))
            raise

    def list(self) -> list[RegistryEntry]:
        """Published versions (those whose manifest is in the store), oldest first. Reads the manifests only, not
        verified: use :meth:`get`. Each entry's ``path`` is where :meth:`get` keeps its verified copy."""
        prefix = self._remote()
        self._fs.invalidate_cache()  # a listing cached earlier would miss versions published since
        try:
            children = self._fs.ls(prefix, detail=False)
        except FileNotFoundError:
            return []
        entries = []
        for child in children:
            version = str(child).rstrip("/").rsplit("/", 1)[-1]
            if not _VERSION.match(version):
                continue
            try:
                manifest_bytes = self._fs.cat_file(f"{prefix}/{version}/{MANIFEST_FILE}")
                signature_bytes = self._fs.cat_file(f"{prefix}/{version}/{SIGNATURE_FILE}")
            except FileNotFoundError:
                continue  # being published, or a publish that died: not a version yet
            where = self.location_of(version)
            manifest = _parse_manifest(manifest_bytes, f"{where}/{MANIFEST_FILE}")
            signature = _parse_signature(signature_bytes, f"{where}/{SIGNATURE_FILE}")
            entries.append(
                RegistryEntry(
                    model_name=manifest.model_name,
                    version=manifest.version,
                    path=self._version_dir(version),
                    created_at=manifest.created_at,
                    key_id=signature.key_id,
                    size_bytes=manifest.size_bytes,
                )
            )
        return sorted(entries, key=lambda e: (version_key(e.version), e.created_at))

    def get(self, version: str) -> RegistryEntry:
        """A published version, downloaded and verified against the trusted keys; its ``path`` is the local copy."""
        local = self._version_dir(version)
        remote = self._remote(version)
        found = self._fs.find(remote, detail=True)
        if f"{remote}/{MANIFEST_FILE}" not in found:
            known = ", ".join(e.version for e in self.list()) or "none"
            raise ArtifactNotFoundError(
                f"{self.model_name} has no version {version!r} at {self.url} (published: {known})"
            )
        self.model_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.fetching-", dir=self.model_dir))
        try:
            download_objects(self._fs, remote, found, staging, self.location_of(version))
            try:
                verify_artifact(staging, self.trusted_keys)
            except (ArtifactError, SignatureError) as err:
                raise type(err)(f"{self.location_of(version)}: {err}") from None
            self._keep(staging, local)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self._entry(version)

    @staticmethod
    def _keep(staging: Path, local: Path) -> None:
        """Make the verified download the local copy. A copy already there with the same manifest holds the same
        bytes (every file is pinned by its hash) and stays, so a reader of it is never disturbed."""
        if local.is_dir():
            if (local / MANIFEST_FILE).read_bytes() == (staging / MANIFEST_FILE).read_bytes():
                return
            shutil.rmtree(local)
        try:
            staging.rename(local)
        except OSError:
            if not local.is_dir():  # another process put its own verified copy there first: that one stays
                raise
