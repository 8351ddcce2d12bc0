"""``GET /api/v1/models/calibration``: each registered version's calibration map and validation figures, read from
its signed ``precursor.json``; a version edited after signing is named, not shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from models.edge.calibration import Calibration, reliability_bins
from models.edge.registry import ModelRegistry, sign_artifact
from models.edge.signing import generate_keypair, load_private_key, load_public_keys
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import AUTH, TOKEN

PLATT = Calibration(method="platt", a=0.62, b=-1.3, fitted_on=400, positives=31, reason="Platt scaling on 400 windows")


def _config(calibration: Calibration | None, **validation: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"threshold": 0.41, "validation": {"pr_auc": 0.7, **validation}}
    if calibration is not None:
        config["calibration"] = calibration.model_dump(mode="json")
    return config


def publish(registry: ModelRegistry, keys: Path, tmp: Path, version: str, config: dict[str, Any]) -> Path:
    artifact = tmp / f"artifact-{version}"
    artifact.mkdir()
    (artifact / "precursor.json").write_text(json.dumps(config))
    (artifact / "model.onnx").write_bytes(b"not a real model")

    sign_artifact(artifact, model_name="precursor-lm", version=version, private_key=load_private_key(keys / "k.key"))
    return registry.publish(artifact).path


def write_registry(tmp: Path) -> Path:
    """0.1.0 made before calibration existed, 0.2.0 Platt-calibrated with its bins, 0.3.0 edited after signing."""
    keys = tmp / "keys"
    generate_keypair(keys, "k")
    root = tmp / "registry"
    registry = ModelRegistry(root, load_public_keys(keys))
    publish(registry, keys, tmp, "0.1.0", _config(None))
    bins = [b.model_dump(mode="json") for b in reliability_bins([True, False, False, False], [0.8, 0.1, 0.15, 0.3])]
    publish(
        registry,
        keys,
        tmp,
        "0.2.0",
        _config(
            PLATT,
            windows=400,
            failed_windows=31,
            ece_raw=0.21,
            ece_calibrated=0.03,
            brier_raw=0.12,
            brier_calibrated=0.06,
            reliability_calibrated=bins,
        ),
    )
    edited = publish(registry, keys, tmp, "0.3.0", _config(PLATT, ece_calibrated=0.03))
    (edited / "precursor.json").write_text(json.dumps(_config(PLATT, ece_calibrated=0.0001)))
    return root


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return write_registry(tmp_path)


def client_for(tmp_path: Path, registry: Path | None) -> TestClient:
    settings = ApiSettings(tokens=TOKEN, store=tmp_path / "no-store.duckdb", model_registry=registry)
    return TestClient(create_app(settings, KafkaSettings()))


def test_every_version_is_listed_with_its_map_and_validation_figures(tmp_path: Path, registry: Path) -> None:
    with client_for(tmp_path, registry) as client:
        response = client.get("/api/v1/models/calibration", headers=AUTH)
    assert response.status_code == 200, response.text
    by_version = {v["version"]: v for v in response.json()}
    assert list(by_version) == ["0.1.0", "0.2.0", "0.3.0"]

    old = by_version["0.1.0"]
    assert old["calibration"]["method"] == "identity" and old["is_identity"] is True
    assert old["calibration"]["reason"] == "identity: made before calibration was fitted"
    assert old["validation"]["ece_raw"] is None and old["validation"]["reliability"] is None
    assert old["error"] is None

    platt = by_version["0.2.0"]
    assert platt["model_name"] == "precursor-lm" and len(platt["key_id"]) > 0
    assert platt["calibration"]["a"] == pytest.approx(0.62) and platt["calibration"]["b"] == pytest.approx(-1.3)
    assert platt["calibration"]["reason"] == "Platt scaling on 400 windows" and platt["is_identity"] is False
    v = platt["validation"]
    assert (v["ece_raw"], v["ece_calibrated"], v["brier_raw"], v["brier_calibrated"]) == (0.21, 0.03, 0.12, 0.06)
    assert len(v["reliability"]) == 10 and sum(b["count"] for b in v["reliability"]) == 4
    assert platt["threshold"] == pytest.approx(0.41)


def test_a_precursor_json_edited_after_signing_is_named_not_shown(tmp_path: Path, registry: Path) -> None:
    with client_for(tmp_path, registry) as client:
        answer = client.get("/api/v1/models/calibration", headers=AUTH).json()
    edited = next(v for v in answer if v["version"] == "0.3.0")
    assert edited["calibration"] is None and edited["validation"] is None
    assert "precursor.json has sha256" in edited["error"] and "signed manifest" in edited["error"]


def test_no_registry_configured_is_an_empty_list_and_a_missing_one_503(tmp_path: Path) -> None:
    with client_for(tmp_path, None) as client:
        response = client.get("/api/v1/models/calibration", headers=AUTH)
        assert client.get("/api/v1/models/calibration").status_code == 401  # no token, no data
    assert response.status_code == 200 and response.json() == []
    with client_for(tmp_path, tmp_path / "nowhere") as client:
        response = client.get("/api/v1/models/calibration", headers=AUTH)
    assert response.status_code == 503 and "nowhere" in response.json()["detail"]


def test_an_empty_registry_is_an_empty_list(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with client_for(tmp_path, tmp_path / "empty") as client:
        assert client.get("/api/v1/models/calibration", headers=AUTH).json() == []
