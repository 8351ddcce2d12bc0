"""Staged rollout: canaries first, the fleet once their heartbeats say healthy, the previous champion if not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from flows.rollout import CanaryWatch, KafkaHeartbeats, KafkaReleaseChannel, RolloutReport, staged_rollout
from models.edge.releases import ReleaseSigner, verify_release_statement
from models.edge.signing import key_id
from precursor.contracts.messages import Heartbeat, ModelRelease, decode, encode
from precursor.contracts.settings import KafkaSettings

SHA = "a" * 64


def release(version: str) -> ModelRelease:
    return ModelRelease(
        version=version,
        model_name="precursor-lm",
        sha256=SHA,
        signature="c2ln",
        key_id="0123456789abcdef",
        size_bytes=10,
        artifact_uri=f"file:///registry/precursor-lm/{version}",
    )


def beat(edge: str, version: str, health: str = "ok", seq: int = 0) -> Heartbeat:
    return Heartbeat(
        edge_id=edge,
        seq=seq,
        timestamp=datetime.now(UTC),
        model_name="precursor-lm",
        model_version=version,
        health=health,  # type: ignore[arg-type]
    )


class Channel:
    def __init__(self) -> None:
        self.sent: list[ModelRelease] = []

    def publish(self, release: ModelRelease) -> None:
        self.sent.append(release)


class ScriptedHeartbeats:
    """Heartbeats handed out in the order given, a batch per poll: our own interface, for unit tests."""

    def __init__(self, batches: list[list[Heartbeat]]) -> None:
        self.batches = batches
        self.closed = False

    def poll(self, timeout_s: float) -> list[Heartbeat]:
        if not self.batches:
            time.sleep(min(timeout_s, 0.01))
            return []
        return self.batches.pop(0)

    def close(self) -> None:
        self.closed = True


# --- the watch ---------------------------------------------------------------------------------------------------


def test_a_canary_counts_as_healthy_only_after_enough_ok_heartbeats_on_the_new_version() -> None:
    watch = CanaryWatch("2", ["e1"], healthy_heartbeats=2)
    watch.observe(beat("e1", "1"))
    watch.observe(beat("e1", "2"))
    assert watch.verdict == "pending"
    watch.observe(beat("e1", "2", "degraded"))
    assert watch.verdict == "pending"
    watch.observe(beat("e1", "2"))
    assert watch.verdict == "healthy"


def test_one_failing_heartbeat_on_the_new_version_fails_the_watch_and_other_edges_do_not_count() -> None:
    watch = CanaryWatch("2", ["e1", "e2"], healthy_heartbeats=1)
    watch.observe(beat("e9", "2", "failing"))  # not a canary
    watch.observe(beat("e1", "2"))
    assert watch.states == {"e1": "healthy", "e2": "waiting"}
    watch.observe(beat("e2", "2", "failing"))
    assert watch.verdict == "failing"
    assert "e2: failing, running 2 (failing)" in watch.describe()


def test_a_watch_needs_canaries() -> None:
    with pytest.raises(ValueError, match="at least one canary"):
        CanaryWatch("2", [])


# --- the rollout, with our own fakes of the channel and the heartbeats -----------------------------------------------


def test_without_canaries_the_release_goes_to_the_fleet_at_once() -> None:
    channel = Channel()
    report = staged_rollout(
        release("2"), release("1"), channel, lambda: ScriptedHeartbeats([]), canary_edges=[], deadline_s=1
    )
    assert report.outcome == "released"
    assert [(r.version, r.canary_edges) for r in channel.sent] == [("2", [])]


def test_healthy_canaries_let_the_release_reach_the_fleet() -> None:
    channel = Channel()
    heartbeats = ScriptedHeartbeats([[beat("e1", "1")], [beat("e1", "2"), beat("e2", "2")]])
    report = staged_rollout(
        release("2"),
        release("1"),
        channel,
        lambda: heartbeats,
        canary_edges=["e1", "e2"],
        deadline_s=10,
        healthy_heartbeats=1,
    )
    assert report.outcome == "released"
    assert [(r.version, r.canary_edges) for r in channel.sent] == [("2", ["e1", "e2"]), ("2", [])]
    assert [p.purpose for p in report.published] == ["canary", "fleet"]
    assert heartbeats.closed


def test_a_failing_canary_rolls_the_fleet_back_to_the_previous_release() -> None:
    channel = Channel()
    heartbeats = ScriptedHeartbeats([[beat("e1", "2", "failing")]])
    report = staged_rollout(release("2"), release("1"), channel, lambda: heartbeats, canary_edges=["e1"], deadline_s=10)
    assert report.outcome == "rolled_back"
    assert report.reason == "a canary failed: e1: failing, running 2 (failing)"
    assert [(r.version, r.canary_edges) for r in channel.sent] == [("2", ["e1"]), ("1", [])]
    assert channel.sent[1].released_at > channel.sent[0].released_at  # the rollback is the newest release


def test_silent_canaries_time_out_and_without_a_previous_release_the_candidate_is_only_rejected() -> None:
    channel = Channel()
    started = time.monotonic()
    report = staged_rollout(
        release("2"), None, channel, lambda: ScriptedHeartbeats([]), canary_edges=["e1"], deadline_s=0.3, poll_s=0.05
    )
    assert time.monotonic() - started < 5
    assert report.outcome == "rejected"
    assert "not healthy within 0.3 s" in report.reason and "e1: waiting, no heartbeat" in report.reason
    assert [r.version for r in channel.sent] == ["2"]


def test_a_signed_rollout_signs_each_release_as_published_and_marks_only_the_rollback() -> None:
    key = Ed25519PrivateKey.generate()
    channel = Channel()
    heartbeats = ScriptedHeartbeats([[beat("e1", "2", "failing")]])
    report = staged_rollout(
        release("2"),
        release("1"),
        channel,
        lambda: heartbeats,
        canary_edges=["e1"],
        deadline_s=10,
        sign=ReleaseSigner(key),
    )
    assert report.outcome == "rolled_back"
    for sent in channel.sent:  # signed after the canary list and the issue time were set, so they are covered
        verify_release_statement(decode(ModelRelease, encode(sent)), {key_id(key.public_key()): key.public_key()})
    assert [(r.version, r.canary_edges, r.rollback) for r in channel.sent] == [("2", ["e1"], False), ("1", [], True)]
    assert channel.sent[1].released_at > channel.sent[0].released_at
    assert all(r.expires_at is not None and r.expires_at > r.released_at for r in channel.sent)


# --- against the real broker, with an edge that follows the releases and heartbeats ---------------------------------


class FollowingEdge:
    """An edge's update loop in miniature: applies releases meant for it, heartbeats the version it runs."""

    def __init__(self, settings: KafkaSettings, edge_id: str, running: str, broken_versions: set[str]) -> None:
        self.settings = settings
        self.edge_id = edge_id
        self.running = running
        self.broken = broken_versions
        self.stop = threading.Event()
        self.applied: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        consumer = KafkaConsumer(**self.settings.client_kwargs(), group_id=None, enable_auto_commit=False)
        tp = TopicPartition(self.settings.topics.model_updates, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)  # a fresh topic per test: every release is for this edge to judge
        producer = KafkaProducer(**self.settings.client_kwargs(), acks="all")
        seq = 0
        try:
            while not self.stop.is_set():
                for records in consumer.poll(timeout_ms=100).values():
                    for record in records:
                        r = decode(ModelRelease, record.value)
                        if not r.canary_edges or self.edge_id in r.canary_edges:
                            self.running = r.version
                            self.applied.append(r.version)
                seq += 1
                health = "failing" if self.running in self.broken else "ok"
                hb = beat(self.edge_id, self.running, health, seq)
                producer.send(self.settings.topics.heartbeats, key=self.edge_id.encode(), value=encode(hb))
                producer.flush()
                time.sleep(0.1)
        finally:
            consumer.close()
            producer.close()


@pytest.fixture
def edges(kafka_settings: KafkaSettings) -> Iterator[dict[str, FollowingEdge]]:
    fleet = {name: FollowingEdge(kafka_settings, name, "1", broken_versions={"3"}) for name in ("canary-1", "plant-2")}
    for edge in fleet.values():
        edge.thread.start()
    yield fleet
    for edge in fleet.values():
        edge.stop.set()
        edge.thread.join(timeout=10)


@pytest.mark.integration
def test_through_kafka_a_healthy_canary_promotes_and_a_failing_one_rolls_back(
    kafka_settings: KafkaSettings, edges: dict[str, FollowingEdge]
) -> None:
    channel = KafkaReleaseChannel(kafka_settings)

    def roll_out(new: str, current: str) -> RolloutReport:
        return staged_rollout(
            release(new),
            release(current),
            channel,
            lambda: KafkaHeartbeats(kafka_settings),
            canary_edges=["canary-1"],
            deadline_s=60,
            healthy_heartbeats=2,
            poll_s=0.2,
        )

    def settle(edge: str, version: str) -> None:
        deadline = time.monotonic() + 30
        while edges[edge].running != version and time.monotonic() < deadline:
            time.sleep(0.1)

    try:
        good = roll_out("2", "1")
        assert good.outcome == "released", good.reason
        settle("plant-2", "2")
        assert edges["plant-2"].applied == ["2"]  # only the fleet-wide release, never the canary one

        bad = roll_out("3", "2")
        assert bad.outcome == "rolled_back", bad.reason
        settle("canary-1", "2")
        assert edges["canary-1"].applied == ["2", "2", "3", "2"]
        assert "3" not in edges["plant-2"].applied
    finally:
        channel.close()


@pytest.mark.integration
def test_kafka_heartbeats_skip_invalid_records_and_start_where_the_topic_ended(kafka_settings: KafkaSettings) -> None:
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    topic = kafka_settings.topics.heartbeats
    producer.send(topic, key=b"old", value=encode(beat("old", "1")))
    producer.flush()
    source = KafkaHeartbeats(kafka_settings)
    try:
        producer.send(topic, key=b"e1", value=b"{not json")
        producer.send(topic, key=b"e1", value=encode(beat("e1", "2")))
        producer.flush()
        seen: list[Heartbeat] = []
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            seen += source.poll(0.5)
        assert [(h.edge_id, h.model_version) for h in seen] == [("e1", "2")]
    finally:
        source.close()
        producer.close()
