"""The retrain flow on a real Prefect server: promote only a candidate that wins, sign it, register it, roll it out.

The evidence is a simulated fleet's history written as the labeling pipeline's dataset (seeded: the same windows
and labels every run). Models are tiny and train for a few dozen steps: the flow's decisions are under test here,
not the model's quality.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import pytest
from cryptography.hazmat.primitives import serialization
from kafka import KafkaConsumer, TopicPartition
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.states import State
from typer.testing import CliRunner

from flows.labeled import read_labeled_windows
from flows.rejections import rejected_versions
from flows.retrain import COMPARISON_ARTIFACT_KEY, RetrainReport, check_signing_key, new_version, retrain
from flows.settings import RetrainSettings
from infra.prefect_server import LocalPrefectServer
from models.edge.registry import ModelRegistry, verify_artifact
from models.edge.signing import KeyPair, generate_keypair, load_private_key, load_public_keys
from models.training.dataset import Fleet, build_windows
from models.training.train import TrainSettings
from precursor.contracts.messages import ModelRelease, decode
from precursor.contracts.settings import KafkaSettings
from precursor.flows_cli import flows_app

if TYPE_CHECKING:
    from tests.fixtures_flows import History

pytest_plugins = ["tests.fixtures_prefect", "tests.fixtures_flows"]
pytestmark = pytest.mark.integration


def untrained(history: History) -> TrainSettings:
    """Two steps of training: a model that can only lose."""
    return history.training.model_copy(update={"max_steps": 2, "eval_every": 1})


def run(settings: RetrainSettings) -> tuple[RetrainReport, UUID]:
    state: State = retrain(settings, return_state=True)  # type: ignore[call-overload]
    assert state.is_completed(), state.message
    report = state.result()
    assert isinstance(report, RetrainReport)
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None
    return report, flow_run_id


def comparison_artifact(flow_run_id: UUID) -> str:
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    found = [a for a in artifacts if a.key == COMPARISON_ARTIFACT_KEY]
    assert len(found) == 1, [a.key for a in artifacts]
    return str(found[0].data)


def test_labeled_windows_join_the_field_labels_with_windows_cut_from_telemetry(flows_history: History) -> None:
    fleet = Fleet.load(flows_history.telemetry, flows_history.events, flows_history.machines)
    labeled = read_labeled_windows(flows_history.dataset, fleet, flows_history.training.window_spec())
    assert labeled.rows == len(labeled.windows) > 1000 and labeled.without_telemetry == 0
    from_files = {
        (w.window.machine_id, w.end_s): w.outcome for w in build_windows(fleet, flows_history.training.window_spec())
    }
    assert {(w.window.machine_id, w.end_s): w.outcome for w in labeled.windows} == from_files
    assert len({w.window.machine_id for w in labeled.windows}) == 12


@dataclass(frozen=True)
class FirstRun:
    root: Path
    report: RetrainReport
    flow_run_id: UUID


@pytest.fixture(scope="module")
def first_run(
    flows_history: History, tmp_path_factory: pytest.TempPathFactory, prefect_server: LocalPrefectServer
) -> FirstRun:
    """The first retrain into an empty registry; later tests judge challengers against what it promoted."""
    root = tmp_path_factory.mktemp("first-run")
    report, flow_run_id = run(flows_history.retrain_settings(root))
    return FirstRun(root, report, flow_run_id)


def test_the_first_candidate_is_promoted_signed_registered_and_its_comparison_is_an_artifact(
    flows_history: History, first_run: FirstRun
) -> None:
    report = first_run.report
    assert report.outcome == "promoted", report.reason
    assert report.champion_before is None and report.champion_after == report.version
    registry = ModelRegistry(first_run.root / "registry", load_public_keys(flows_history.keys.public_key_path))
    champion = registry.champion()
    assert champion is not None and champion.version == report.version
    manifest = verify_artifact(champion.path, registry.trusted_keys)
    assert "model.onnx" in manifest.files
    assert champion.key_id == flows_history.keys.key_id
    held_out = report.comparison.held_out
    assert held_out.failures >= 2 and held_out.windows > 100
    markdown = comparison_artifact(first_run.flow_run_id)
    assert markdown.startswith("**Promoted**: no champion yet")
    assert "| pr_auc (promotion metric) | - |" in markdown


def test_a_candidate_that_loses_to_the_champion_is_not_promoted(flows_history: History, first_run: FirstRun) -> None:
    champion = first_run.report
    registry = ModelRegistry(first_run.root / "registry", load_public_keys(flows_history.keys.public_key_path))
    versions_before = [e.version for e in registry.list()]

    loser, flow_run_id = run(flows_history.retrain_settings(first_run.root, training=untrained(flows_history)))

    assert loser.outcome == "not_promoted"
    comparison = loser.comparison
    assert comparison.champion is not None and comparison.champion.version == champion.version
    ours, theirs = comparison.candidate.metrics.pr_auc, comparison.champion.metrics.pr_auc
    assert ours is not None and theirs is not None and ours < theirs + comparison.margin
    assert loser.champion_after == champion.version
    assert [e.version for e in registry.list()] == versions_before  # not exported, signed or registered
    assert loser.artifact is None
    assert comparison_artifact(flow_run_id).startswith("**Not promoted**: candidate pr_auc")


def test_a_winner_whose_canary_stays_silent_is_rolled_back_and_marked_rejected(
    flows_history: History, tmp_path: Path, prefect_server: LocalPrefectServer, kafka_settings: KafkaSettings
) -> None:
    weak, _ = run(flows_history.retrain_settings(tmp_path, training=untrained(flows_history)))
    assert weak.outcome == "promoted"  # no champion yet: even a weak model becomes the first one
    silent = f"edge-{uuid.uuid4().hex[:6]}"
    settings = flows_history.retrain_settings(
        tmp_path, publish=True, kafka=kafka_settings, canary_edges=[silent], canary_deadline_s=3.0
    )

    report, flow_run_id = run(settings)

    assert report.comparison.verdict.promote, report.comparison.verdict.reason
    assert report.outcome == "rolled_back", report.reason
    assert f"{silent}: waiting, no heartbeat" in report.reason
    registry = ModelRegistry(tmp_path / "registry", load_public_keys(flows_history.keys.public_key_path))
    assert report.champion_after == weak.version == registry.champion().version  # type: ignore[union-attr]
    assert report.version in rejected_versions(registry)
    releases = read_releases(kafka_settings)
    assert [(r.version, r.canary_edges) for r in releases] == [(report.version, [silent]), (weak.version, [])]
    assert_private_key_never_left(flows_history.keys, [flow_run_id], releases)


def read_releases(settings: KafkaSettings) -> list[ModelRelease]:
    consumer = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False)
    tp = TopicPartition(settings.topics.model_updates, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    releases = []
    try:
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=1000).values():
                releases += [decode(ModelRelease, r.value) for r in records]
    finally:
        consumer.close()
    return releases


def assert_private_key_never_left(keys: KeyPair, flow_run_ids: list[UUID], releases: list[ModelRelease]) -> None:
    """Neither the PEM nor the raw key bytes appear in the runs' logs, their parameters, or the Kafka messages."""
    private_key = load_private_key(keys.private_key_path)
    raw = private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    pem_body = "".join(keys.private_key_path.read_text().splitlines()[1:-1])
    secrets = [pem_body, base64.b64encode(raw).decode(), raw.hex()]
    with get_client(sync_client=True) as client:
        runs = [client.read_flow_run(i) for i in flow_run_ids]
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=list(flow_run_ids)))
        )
        ids = [*flow_run_ids, *(r.id for r in subflows)]
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
    assert logs, "the runs should have logged something"
    seen = "\n".join(
        [*(log.message for log in logs), *(json.dumps(r.parameters, default=str) for r in runs)]
        + [r.model_dump_json() for r in releases]
    )
    assert "signing with key " + keys.key_id in seen  # the public id is what the logs name
    for secret in secrets:
        assert secret not in seen


def test_a_signing_key_the_registry_would_not_trust_is_refused_before_any_training(
    flows_history: History, tmp_path: Path
) -> None:
    stranger = generate_keypair(tmp_path / "other-keys", "stranger")
    settings = flows_history.retrain_settings(tmp_path, signing_key=stranger.private_key_path)
    with pytest.raises(ValueError, match=f"has key_id {stranger.key_id}, which is not among trusted_keys"):
        check_signing_key(settings)
    assert check_signing_key(flows_history.retrain_settings(tmp_path)) == flows_history.keys.key_id


def test_versions_are_named_by_time_and_never_collide(flows_history: History, tmp_path: Path) -> None:
    settings = flows_history.retrain_settings(tmp_path)
    registry = ModelRegistry(settings.registry, load_public_keys(flows_history.keys.public_key_path))
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert new_version(registry, settings.work_dir, at) == "2026.03.01.120000"
    (settings.work_dir / "2026.03.01.120000").mkdir(parents=True)  # a run that started in the same second
    assert new_version(registry, settings.work_dir, at) == "2026.03.01.120000-2"


def test_cli_run_retrain_names_a_bad_setting_and_its_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))  # the command sets it when unset
    monkeypatch.setenv("PRECURSOR_RETRAIN_PROMOTION_METRIC", "accuracy")
    result = CliRunner().invoke(flows_app, ["run", "retrain", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "promotion_metric='accuracy': Input should be 'pr_auc', 'recall', 'f1', 'precision' or" in result.output
