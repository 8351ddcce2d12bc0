"""The registry's readers take an object store URL as they take a folder: the API's models page (each version's
calibration) and the flow's retraining cost read a registry in a real S3-compatible server the same as its local copy,
and a precursor.json edited in the bucket after signing is named there, with the URL."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from models.training.calibration_report import registry_calibrations
from pipelines.flow import newest_training
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.object_store import ObjectStoreSettings, filesystem
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import AUTH, TOKEN
from tests.test_api_calibration import write_registry

pytest_plugins = ["tests.fixtures_object_store"]


def _uploaded(tmp_path: Path, prefix: str) -> tuple[Path, str]:
    """The calibration test's registry (0.1.0 before calibration, 0.2.0 Platt, 0.3.0 edited after signing), and the
    same objects under ``prefix`` in the bucket."""
    local = write_registry(tmp_path)
    url = f"{prefix}/registry"
    fs, root = filesystem(url)
    fs.put(str(local), root, recursive=True)
    return local, url


def test_the_models_page_reads_a_registry_in_the_bucket_as_its_local_copy(
    tmp_path: Path, s3_env: ObjectStoreSettings, s3_prefix: str
) -> None:
    local, url = _uploaded(tmp_path, s3_prefix)
    answers = []
    for registry in (local, url):
        settings = ApiSettings(tokens=TOKEN, store=tmp_path / "no.duckdb", model_registry=registry)
        app = create_app(settings, KafkaSettings())
        with TestClient(app) as client:
            response = client.get("/api/v1/models/calibration", headers=AUTH)
        assert response.status_code == 200, response.text
        answers.append({v["version"]: v for v in response.json()})
    from_disk, from_bucket = answers
    assert list(from_bucket) == ["0.1.0", "0.2.0", "0.3.0"]
    for version in ("0.1.0", "0.2.0"):
        assert from_bucket[version] == from_disk[version]
    assert from_bucket["0.2.0"]["validation"]["ece_calibrated"] == 0.03
    edited = from_bucket["0.3.0"]
    assert edited["calibration"] is None and "signed manifest" in edited["error"]
    assert url in edited["error"] and str(tmp_path) not in edited["error"]  # names the bucket, not a scratch folder


def test_a_bucket_without_a_registry_is_a_503_naming_it(
    tmp_path: Path, s3_env: ObjectStoreSettings, s3_prefix: str
) -> None:
    url = f"{s3_prefix}/nothing-here"
    app = create_app(ApiSettings(tokens=TOKEN, store=tmp_path / "no.duckdb", model_registry=url), KafkaSettings())
    with TestClient(app) as client:
        response = client.get("/api/v1/models/calibration", headers=AUTH)
    assert response.status_code == 503 and url in response.json()["detail"]


def test_retraining_cost_reads_the_newest_version_in_the_bucket(
    tmp_path: Path, s3_env: ObjectStoreSettings, s3_prefix: str
) -> None:
    url = f"{s3_prefix}/registry"
    fs, root = filesystem(url)
    assert newest_training(url) is None  # nothing there yet
    for version, cpu_s in (("1", 80.0), ("2", 40.0)):  # "2" written last
        meta = {"training": {"cpu_s": cpu_s, "seconds": 60.0}, "data": {"training_windows": {"ok": 9, "failure": 1}}}
        fs.pipe_file(f"{root}/precursor-lm/{version}/precursor.json", json.dumps(meta).encode())
    trained = newest_training(url)
    assert trained is not None and (trained.version, trained.cpu_s, trained.windows) == ("2", 40.0, 10)
    unsigned = registry_calibrations(url)  # no manifests: each listed with why, none shown
    assert [v.version for v in unsigned] == ["1", "2"]
    assert all(v.calibration is None and v.error and url in v.error for v in unsigned), unsigned
