"""What each registered model version says about its calibration: the map it carries and how well it fits validation.

Read from every ``ROOT/<model_name>/<version>/precursor.json`` of a model registry (:mod:`models.edge.registry`), the
bytes checked against the version's manifest as they are read, so a ``precursor.json`` edited after signing is
reported as such rather than shown. The manifest's signature is not checked here (whoever reads this may hold no
trusted keys): the signing key's id is reported beside the figures, and loaders verify before they score.

A version that cannot be read is listed with its ``error``, the others still are.

Torch-free: the API imports this.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from models.edge.calibration import Calibration, ReliabilityBin, calibration_of
from models.edge.object_registry import download_objects, version_objects
from models.edge.registry import (
    CONFIG_FILE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ArtifactError,
    ModelRegistry,
    _parse_manifest,
    _read_signed,
    read_verified_file,
)
from precursor.contracts.object_store import ObjectStoreSettings, is_url


class ValidationCalibration(BaseModel):
    """The validation period's ECE and Brier score before and after the map (None where training did not record
    them: an artifact made before calibration existed)."""

    model_config = ConfigDict(extra="forbid")

    windows: int | None = None
    failed_windows: int | None = None
    ece_raw: float | None = None
    ece_calibrated: float | None = None
    brier_raw: float | None = None
    brier_calibrated: float | None = None
    reliability: list[ReliabilityBin] | None = None
    """The calibrated risks' reliability bins on validation, where the artifact carries them."""


class VersionCalibration(BaseModel):
    """One registered version's calibration map and its validation figures."""

    model_config = ConfigDict(extra="forbid")

    model_name: str
    version: str
    created_at: str | None = None
    key_id: str | None = None
    threshold: float | None = None
    calibration: Calibration | None = None
    is_identity: bool | None = None
    validation: ValidationCalibration | None = None
    error: str | None = None
    """Why this version's calibration could not be read (nothing else is filled in then)."""


def _figures(validation: Any) -> ValidationCalibration:
    if not isinstance(validation, dict):
        return ValidationCalibration()
    known = {k: validation.get(k) for k in ValidationCalibration.model_fields if k != "reliability"}
    bins = validation.get("reliability_calibrated")
    return ValidationCalibration(**known, reliability=bins if isinstance(bins, list) else None)


def version_calibration(path: Path) -> VersionCalibration:
    """The calibration of the artifact at ``path`` (``ROOT/<model_name>/<version>``)."""
    model_name, version = path.parent.name, path.name
    try:
        manifest_bytes, signature = _read_signed(path)
        manifest = _parse_manifest(manifest_bytes, str(path / "manifest.json"))
        config = json.loads(read_verified_file(path, CONFIG_FILE, manifest))
        if not isinstance(config, dict):
            raise ValueError(f"{path / CONFIG_FILE} is not a JSON object")
        calibration = calibration_of(config)
        if "calibration" not in config:
            calibration = calibration.model_copy(update={"reason": "identity: made before calibration was fitted"})
        return VersionCalibration(
            model_name=manifest.model_name,
            version=manifest.version,
            created_at=manifest.created_at.isoformat().replace("+00:00", "Z"),
            key_id=signature.key_id,
            threshold=config.get("threshold"),
            calibration=calibration,
            is_identity=calibration.is_identity,
            validation=_figures(config.get("validation")),
        )
    except (ArtifactError, OSError, ValueError, ValidationError) as err:
        # json.JSONDecodeError and pydantic's ValidationError are ValueErrors too; the message names the file
        return VersionCalibration(model_name=model_name, version=version, error=str(err))


_SMALL_FILES = (MANIFEST_FILE, SIGNATURE_FILE, CONFIG_FILE)


def registry_calibrations(root: Path | str, *, settings: ObjectStoreSettings | None = None) -> list[VersionCalibration]:
    """Every version of every model name under ``root`` (a folder, or an object store URL such as
    ``s3://bucket/registry``), each model's oldest version first.

    Raises ``FileNotFoundError`` naming ``root`` if it is not a folder, or a URL with nothing under it."""
    if is_url(root):
        return _object_store_calibrations(str(root), settings)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"model registry {root} is not a directory")
    out: list[VersionCalibration] = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            registry = ModelRegistry(root, trusted_keys={}, model_name=model_dir.name)
        except ValueError:
            continue  # not a model name: no registry folder of ours
        names = {p.name for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")}
        try:
            listed = [e.path for e in registry.list()]
        except (ArtifactError, OSError) as err:
            # one unreadable manifest stops list(); still report every version, each with its own error
            listed = [model_dir / n for n in sorted(names)]
            if not listed:
                out.append(VersionCalibration(model_name=model_dir.name, version="?", error=str(err)))
        out.extend(version_calibration(p) for p in listed)
    return out


def _object_store_calibrations(url: str, settings: ObjectStoreSettings | None) -> list[VersionCalibration]:
    """:func:`registry_calibrations` of a registry in an object store: each version's manifest, signature and
    ``precursor.json`` (a few KB; never the model) are copied into a scratch folder laid out as a local registry and
    read there by the same code, each file checked against its manifest as a local one is. Errors name the URL."""
    fs, root, wanted = version_objects(url, _SMALL_FILES, settings)
    with tempfile.TemporaryDirectory(prefix="registry-") as scratch:
        mirror = Path(scratch) / "registry"
        mirror.mkdir()
        download_objects(fs, root, wanted, mirror, url)
        found = registry_calibrations(mirror)
    where = str(mirror)
    return [v.model_copy(update={"error": v.error.replace(where, url.rstrip("/"))}) if v.error else v for v in found]
