"""Model updates over the air, against the real broker: a release with a wrong signature, a wrong hash, or a model
that fails its self-test is refused while the old model keeps serving; a good one is running within 10 s of its
release, and the heartbeat says so. Unit checks of the self-test and of rollback need no broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer

from contracts.messages import Heartbeat, ModelRelease, decode, encode
from contracts.settings import KafkaSettings
from edge_agent.config import EdgeConfig, SelfTestSpec
from edge_agent.daemon import AgentDaemon
from edge_agent.scorers import RunningModel, ScorerSlot, load_running
from edge_agent.updates import ModelUpdater, UpdateRefused, self_test
from models.baselines import DriftZScore
from models.registry import pack, release_for
from models.scoring import Window
from models.signing import generate_keypair
from tests.test_edge_support import TelemetryWriter, build_artifact, resign, wait_for

SENSORS = ("pressure", "temp", "vib")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    generate_keypair(root / "trusted", "release")
    generate_keypair(root / "untrusted", "intruder")
    trusted, untrusted = root / "trusted" / "release.key", root / "untrusted" / "intruder.key"
    v1 = build_artifact(root, "0.1.0", trusted, SENSORS)
    return {
        "keys": root / "trusted" / "release.pub",
        "v1": v1,
        "v2": resign(v1, root / "artifact-0.2.0", "0.2.0", trusted),
        "intruder": resign(v1, root / "artifact-0.3.0", "0.3.0", untrusted),
        "blind": build_artifact(root, "0.4.0", trusted, ("flow", "rpm", "torque")),
    }


@pytest.fixture
def agent(tmp_path: Path, kafka_settings: KafkaSettings, artifacts: dict[str, Path]) -> Iterator[AgentDaemon]:
    writer = TelemetryWriter(tmp_path / "telemetry.csv", [f"t-{i}" for i in range(4)], step_s=10, tick_s=0.05)
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-ota",
            "kafka": {
                "bootstrap_servers": kafka_settings.bootstrap_servers,
                "topic_prefix": kafka_settings.topic_prefix,
            },
            "sources": [{"type": "tail", "path": "telemetry.csv", "poll": "0.05s"}],
            "window": {"length": "2m", "every": "1m", "min_points": 3},
            "model": {"type": "lm", "artifact": str(artifacts["v1"]), "trusted_keys": [str(artifacts["keys"])]},
            "updates": {"poll": "0.2s"},
            "heartbeat": {"interval": "3s"},
            "health": {"port": 0},
            "exit_when_sources_end": False,
            "state_dir": "state",
        },
        base=tmp_path,
    )
    daemon = AgentDaemon(config)
    runner = threading.Thread(target=daemon.run, name="agent", daemon=True)
    runner.start()
    writer.start()
    try:
        yield daemon
    finally:
        writer.finish()
        daemon.request_stop()
        runner.join(30)


def publish(settings: KafkaSettings, release: ModelRelease) -> float:
    """Send a release as the registry would (keyed by target, on the compacted topic); when Kafka acknowledged it."""
    producer = KafkaProducer(**settings.client_kwargs(), acks="all")
    producer.send(settings.topics.model_updates, key=release.target.encode(), value=encode(release)).get(timeout=30)
    released_at = time.monotonic()
    producer.close()
    return released_at


def refused(daemon: AgentDaemon, release: ModelRelease) -> str:
    assert daemon.updater is not None
    key = ModelUpdater.release_key(release)
    wait_for(lambda: key in daemon.updater.refused, 20, what=f"{release.version} refused")  # type: ignore[union-attr]
    assert daemon.slot.running.scorer.version == "0.1.0"  # the old model keeps serving
    return daemon.updater.refused[key]


@pytest.mark.integration
def test_bad_releases_are_refused_and_a_good_one_runs_within_10_s_shown_in_the_heartbeat(
    agent: AgentDaemon, kafka_settings: KafkaSettings, artifacts: dict[str, Path]
) -> None:
    wait_for(lambda: agent.agent.stats.predictions >= 8, 30, what="the first model predicting")
    assert agent.slot.running.scorer.version == "0.1.0"

    intruder = release_for(artifacts["intruder"])
    publish(kafka_settings, intruder)
    reason = refused(agent, intruder)
    assert "signature check failed" in reason and "not a trusted key" in reason

    forged = release_for(artifacts["v2"]).model_copy(update={"signature": release_for(artifacts["v1"]).signature})
    publish(kafka_settings, forged)
    assert "does not match the signed data" in refused(agent, forged)

    wrong_hash = release_for(artifacts["v2"]).model_copy(update={"sha256": "ab" * 32})
    publish(kafka_settings, wrong_hash)
    assert "hash check failed" in refused(agent, wrong_hash)

    blind = release_for(artifacts["blind"])
    publish(kafka_settings, blind)
    reason = refused(agent, blind)
    assert "self-test" in reason and "min_sensor_coverage" in reason

    good = release_for(artifacts["v2"])
    consumer = KafkaConsumer(**kafka_settings.client_kwargs(), auto_offset_reset="latest", consumer_timeout_ms=500)
    consumer.subscribe([kafka_settings.topics.heartbeats])
    consumer.poll(timeout_ms=2000)  # joined: from here on it sees new heartbeats
    released_at = publish(kafka_settings, good)
    seen: list[Heartbeat] = []
    deadline = released_at + 15
    while time.monotonic() < deadline and not any(h.model_version == "0.2.0" for h in seen):
        for records in consumer.poll(timeout_ms=200).values():
            seen += [decode(Heartbeat, r.value) for r in records]
    running_after = time.monotonic() - released_at
    consumer.close()
    shown = [h for h in seen if h.model_version == "0.2.0"]
    assert shown, f"no heartbeat with 0.2.0 within 15 s: {[h.model_version for h in seen]}"
    assert running_after < 10.0
    assert shown[0].model_sha256 == good.sha256 and shown[0].edge_id == "edge-ota"
    assert agent.slot.running.scorer.version == "0.2.0"
    assert agent.slot.previous is not None and agent.slot.previous.scorer.version == "0.1.0"  # kept for rollback
    before = agent.agent.stats.predictions
    wait_for(lambda: agent.agent.stats.predictions > before, 10, what="predictions by the new model")
    # A restart runs what was running: the update, verified again.
    running, previous = load_running(agent.config.model, agent.config.state_dir / "models" / "current.json")
    assert (running.scorer.version, running.sha256) == ("0.2.0", good.sha256)
    assert previous is not None and previous.scorer.version == "0.1.0"


def window(sensors: tuple[str, ...]) -> Window:
    stamps = np.arange(0, 600, 60, dtype=np.int64) + 1_767_225_600
    at = datetime.fromtimestamp(1_767_226_200, UTC)
    return Window("m1", at, at, stamps, sensors, np.ones((len(stamps), len(sensors)), dtype=np.float32))


class FakeScorer:
    name, version, horizon_h = "fake", "1", 24.0

    def __init__(self, risk: dict[str, float] | None = None, fail: bool = False, delay_s: float = 0.0) -> None:
        self.risk, self.fail, self.delay_s = risk or {"failure": 0.1}, fail, delay_s

    def score(self, w: Window) -> dict[str, float]:
        return self.score_many([w])[0]

    def score_many(self, windows: list[Window]) -> list[dict[str, float]]:
        if self.fail:
            raise RuntimeError("ONNX went away")
        time.sleep(self.delay_s)
        return [dict(self.risk) for _ in windows]


@pytest.mark.parametrize(
    ("scorer", "sensors", "reason"),
    [
        (FakeScorer(fail=True), None, "raised RuntimeError: ONNX went away"),
        (FakeScorer({"failure": float("nan")}), None, "is not a probability"),
        (FakeScorer({"bearing": 0.2}), None, "has no 'failure' key"),
        (FakeScorer(delay_s=0.05), None, "ms per window, over max_ms_per_window"),
        (FakeScorer(), ("flow", "rpm"), "recent windows carry 0 of them"),
    ],
)
def test_self_test_refuses_a_model_that_cannot_serve_here(
    scorer: FakeScorer, sensors: tuple[str, ...] | None, reason: str
) -> None:
    with pytest.raises(UpdateRefused, match=reason):
        self_test(scorer, [window(("temp", "vib"))], sensors=sensors, spec=SelfTestSpec(max_ms_per_window=10))


def test_self_test_passes_a_model_that_serves() -> None:
    self_test(FakeScorer(), [window(("temp", "vib"))] * 3, sensors=("temp", "vib", "flow"), spec=SelfTestSpec())


def updater_for(tmp_path: Path, artifacts: dict[str, Path], **updates: object) -> ModelUpdater:
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-u",
            "sources": [{"type": "tail", "path": "t.csv"}],
            "model": {"trusted_keys": [str(artifacts["keys"])]},
            "updates": updates,
            "state_dir": str(tmp_path / "state"),
        }
    )
    slot = ScorerSlot(RunningModel(DriftZScore()))
    return ModelUpdater(config, slot, lambda: [window(SENSORS)] * 4)


def test_a_packed_archive_is_fetched_verified_and_swapped_in(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    archive = pack(artifacts["v2"], tmp_path / "v2.tar.gz")
    updater = updater_for(tmp_path, artifacts)
    outcome = updater.apply(release_for(archive))
    assert outcome.applied, outcome.reason
    assert updater.slot.running.scorer.version == "0.2.0" and updater.slot.previous is not None
    assert updater.apply(release_for(archive)).reason == "already running"
    # It then fails while running: rolled back, and its release is not taken again (also after a restart).
    updater.slot.on_rollback = updater.model_failed
    assert updater.slot.rollback("RuntimeError: session lost")
    assert updater.slot.running.scorer.name == "drift-zscore"
    again = updater_for(tmp_path, artifacts).apply(release_for(archive))
    assert not again.applied and "failed while running: RuntimeError: session lost" in again.reason


def test_releases_for_others_too_big_or_missing_are_skipped_or_refused(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    updater = updater_for(tmp_path, artifacts, max_bytes=1000)
    good = release_for(artifacts["v2"])
    assert "target 'site-9'" in updater.apply(good.model_copy(update={"target": "site-9"})).reason
    assert (
        updater.apply(good.model_copy(update={"canary_edges": ["edge-other"]})).reason
        == "a canary release for other edges"
    )
    assert "over updates.max_bytes=1000" in updater.apply(good).reason
    roomy = updater_for(tmp_path / "roomy", artifacts)
    gone = good.model_copy(update={"artifact_uri": (tmp_path / "nowhere").as_uri(), "sha256": "cd" * 32})
    assert "no such file or folder" in roomy.apply(gone).reason
    assert roomy.slot.running.scorer.name == "drift-zscore"
