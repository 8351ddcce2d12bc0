"""Object storage against a real S3-compatible server (gofakes3 in its own process): the labeling pipeline writes the
dataset to s3:// and the retrain flow reads it back; a model is registered, promoted and released on s3://, an edge
fetches it from there and swaps it in, and a tampered object in the bucket is refused. Secrets stay out of reprs,
logs and the Prefect server. Without the bucket: settings from the standard AWS variables, the error that names the
``s3`` extra when s3fs is missing, and the object copy refusing a name that climbs out of its folder."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from edge_agent.config import EdgeConfig
from edge_agent.scorers import RunningModel, ScorerSlot
from edge_agent.updates import ModelUpdater
from flows.labeled import field_labels
from flows.retrain import retrain
from infra.prefect_server import LocalPrefectServer
from models.edge.baselines import DriftZScore
from models.edge.object_registry import ObjectStoreRegistry, download_objects, open_registry
from models.edge.registry import ArtifactError, TamperedArtifactError
from models.edge.signing import load_public_keys
from models.training.dataset import Fleet, build_windows
from pipelines.edge_trust import release_hashes
from pipelines.labeling import read_dataset, run_labeling
from precursor.contracts.object_store import MissingExtraError, ObjectStoreSettings, as_location, filesystem
from precursor.contracts.settings import KafkaSettings
from tests.test_flows_retrain import read_releases
from tests.test_pipeline_labeling import NO_LATENESS, FleetHistory, steady, store_history

if TYPE_CHECKING:
    from tests.fixtures_flows import History

pytest_plugins = ["tests.fixtures_prefect", "tests.fixtures_flows", "tests.fixtures_object_store"]

SECRET = f"s3-secret-{uuid.uuid4().hex}"


# --- without a bucket ------------------------------------------------------------------------------------------------


def test_settings_read_the_standard_aws_variables_and_never_show_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws-variable:9000")
    monkeypatch.setenv("PRECURSOR_S3_ENDPOINT_URL", "http://ours:9000")  # ours wins over the generic AWS one
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "PRECURSOR_S3_MAX_ATTEMPTS", "PRECURSOR_S3_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    settings = ObjectStoreSettings()
    options = settings.storage_options("s3")
    assert options["key"] == "AKIAEXAMPLE" and options["secret"] == SECRET
    assert options["endpoint_url"] == "http://ours:9000" and options["client_kwargs"] == {"region_name": "eu-west-1"}
    assert options["config_kwargs"] == {"retries": {"mode": "standard", "total_max_attempts": 3}}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # the standard variable counts attempts, the first included
    assert ObjectStoreSettings().storage_options("s3")["config_kwargs"]["retries"]["total_max_attempts"] == 1
    assert settings.storage_options("gcs") == {}
    assert SECRET not in repr(settings) and SECRET not in str(settings) and SECRET not in settings.model_dump_json()
    with pytest.raises(ValueError) as refused:
        ObjectStoreSettings(secret_access_key=SECRET, addressing_style="sideways")  # type: ignore[arg-type]
    assert SECRET not in str(refused.value)
    assert as_location("s3://b/x") == "s3://b/x" and as_location("data/x") == Path("data/x")


def hide_s3fs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an edge installed without the ``s3`` extra: ``import s3fs`` fails."""
    monkeypatch.setitem(sys.modules, "s3fs", None)
    # fsspec remembers the class of a protocol it loaded once; forget it, so it imports s3fs again
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry, "s3", raising=False)


def test_without_s3fs_the_error_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_s3fs(monkeypatch)
    with pytest.raises(MissingExtraError, match=r"s3://bucket/registry: .*pip install 'precursor\[s3\]'"):
        filesystem("s3://bucket/registry", ObjectStoreSettings())


def test_an_object_whose_name_climbs_out_of_the_target_is_refused_and_never_written(tmp_path: Path) -> None:
    """What the registry and the edge both copy a version with: the name below the prefix must stay inside."""
    (tmp_path / "bucket" / "v1" / "model").mkdir(parents=True)
    (tmp_path / "bucket" / "v1" / "manifest.json").write_bytes(b"{}")
    (tmp_path / "bucket" / "v1" / "model" / "graph.onnx").write_bytes(b"graph")
    fs, root = filesystem(tmp_path / "bucket")
    target = tmp_path / "copy"
    download_objects(fs, f"{root}/v1", fs.find(f"{root}/v1"), target, "s3://bucket/v1")
    assert (target / "model" / "graph.onnx").read_bytes() == b"graph"
    climbing = [f"{root}/v1/manifest.json", f"{root}/v1/../escape"]
    with pytest.raises(ArtifactError, match=r"s3://bucket/v1: object '\.\./escape' has an empty, '\.' or '\.\.'"):
        download_objects(fs, f"{root}/v1", climbing, tmp_path / "second", "s3://bucket/v1")
    assert not (tmp_path / "escape").exists()


# --- the labeled dataset ---------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_labeling_pipeline_writes_the_dataset_to_s3_and_the_retrain_reader_reads_it_back(
    tmp_path: Path, s3_env: ObjectStoreSettings, s3_prefix: str
) -> None:
    history = FleetHistory(machines=2, hours=60, failures=[("pump-00", 30.5, "failure:bearing")])
    tail = [
        history._event(m, 100, "error:E1").model_copy(update={"seq": 10_000 + i})
        for i, m in enumerate(history.machine_ids())
    ]
    store = store_history(tmp_path / "store.duckdb", history.messages(steady) + tail)
    dataset = f"{s3_prefix}/labeled"

    local = run_labeling(store, tmp_path / "labeled", settings=NO_LATENESS)
    remote = run_labeling(store, dataset, settings=NO_LATENESS)

    assert remote.examples == local.examples == 2 * 60 and remote.outcomes == local.outcomes
    assert remote.days == local.days and remote.days_rewritten == local.days
    fs, root = filesystem(dataset)
    assert sorted(p[len(root) + 1 :] for p in fs.find(root)) == [
        "_dataset.json",
        *(f"day={day}/part-0.parquet" for day in local.days),
    ]
    assert read_dataset(dataset).equals(read_dataset(tmp_path / "labeled"))
    assert field_labels(dataset) == field_labels(tmp_path / "labeled")  # what the retrain flow reads first
    again = run_labeling(store, dataset, settings=NO_LATENESS)
    assert again.days == local.days and again.days_rewritten == []  # idempotent there too: no day rewritten


# --- the registry, releases and the edge -----------------------------------------------------------------------------


def edge_updater(state_dir: Path, history: History, settings: ObjectStoreSettings) -> ModelUpdater:
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-s3",
            "sources": [{"type": "tail", "path": "t.csv"}],
            "model": {"trusted_keys": [str(history.keys.public_key_path)]},
            "state_dir": str(state_dir),
        }
    )
    fleet = Fleet.load(history.telemetry, history.events, history.machines)
    recent = [w.window for w in build_windows(fleet, history.training.window_spec())[:4]]
    slot = ScorerSlot(RunningModel(DriftZScore()), state_file=config.state_dir / "models" / "current.json")
    return ModelUpdater(config, slot, lambda: recent, object_store=settings)


@pytest.mark.integration
def test_a_model_registered_and_released_on_s3_is_fetched_and_swapped_in_and_a_tampered_object_is_refused(
    flows_history: History,
    tmp_path: Path,
    prefect_server: LocalPrefectServer,
    kafka_settings: KafkaSettings,
    s3_env: ObjectStoreSettings,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore and s3fs say the most at DEBUG: the secret must not be in it
    assert s3_env.secret_access_key is not None
    secret = s3_env.secret_access_key.get_secret_value()
    dataset, registry_url = f"{s3_prefix}/labeled", f"{s3_prefix}/registry"
    fs, root = filesystem(dataset)
    fs.put(str(flows_history.dataset), root, recursive=True)
    settings = flows_history.retrain_settings(
        tmp_path,
        labeled_dataset=dataset,
        registry=registry_url,
        publish=True,
        kafka=kafka_settings,
        training=flows_history.training.model_copy(update={"max_steps": 2, "eval_every": 1}),
    )
    assert settings.object_store == s3_env and settings.registry == registry_url

    state = retrain(settings, return_state=True)  # type: ignore[call-overload]
    assert state.is_completed(), state.message
    report = state.result()

    # Promoted on the evidence read from the bucket, registered there and announced from there.
    assert report.outcome == "promoted", report.reason
    assert report.comparison.held_out.windows > 100
    registry = open_registry(registry_url, load_public_keys(flows_history.keys.public_key_path))
    assert isinstance(registry, ObjectStoreRegistry)
    champion = registry.champion()
    assert champion is not None and champion.version == report.version
    version_url = f"{registry_url}/{settings.model_name}/{report.version}"
    objects = {p.rsplit("/", 1)[-1] for p in fs.find(filesystem(version_url)[1])}
    assert {"manifest.json", "manifest.sig", "model.onnx", "precursor.json"} <= objects
    (release,) = read_releases(kafka_settings)
    assert release.artifact_uri == version_url and release.version == report.version
    assert release_hashes(registry_url) == {release.sha256}  # what ingest tells a known model from an unknown one

    # An edge without the s3 extra refuses for now, naming it, and tries again later; with it, it swaps.
    with monkeypatch.context() as without:
        hide_s3fs(without)
        edge = edge_updater(tmp_path / "edge", flows_history, s3_env)
        missing = edge.apply(release)
    assert not missing.applied and missing.retry and "pip install 'precursor[s3]'" in missing.reason
    applied = edge.apply(release)
    assert applied.applied, applied.reason
    assert edge.slot.running.scorer.version == report.version and edge.slot.running.sha256 == release.sha256

    # One changed byte of the model in the bucket: another edge refuses the release, and so does the registry.
    model_key = filesystem(f"{version_url}/model.onnx")[1]
    genuine = bytearray(fs.cat_file(model_key))
    genuine[len(genuine) // 2] ^= 0xFF
    fs.pipe_file(model_key, bytes(genuine))
    other = edge_updater(tmp_path / "other-edge", flows_history, s3_env)
    tampered = other.apply(release)
    assert not tampered.applied and not tampered.retry
    assert tampered.reason.startswith("hash check failed") and "model.onnx has sha256" in tampered.reason
    assert other.slot.running.scorer.name == "drift-zscore"
    with pytest.raises(TamperedArtifactError, match=rf"{version_url}: .*model.onnx has sha256"):
        registry.get(report.version)

    # The secret key signed every request, and appears in no log line, repr, flow parameter or Prefect log.
    assert secret not in caplog.text and secret not in repr(settings)
    assert "s3fs" in caplog.text or "botocore" in caplog.text, "the store's clients should have logged at DEBUG"
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    assert logs and secret not in "\n".join(log.message for log in logs)
    assert secret not in json.dumps(run.parameters, default=str)
