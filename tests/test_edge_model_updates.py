"""Model updates over the air, against the real broker: a release with a wrong signature, a wrong hash, or a model
that fails its self-test is refused while the old model keeps serving, junk on the topic is skipped; a good one is
running within 10 s of its release, and the heartbeat says so. Without a broker: the self-test, rollback, and the
release checks (forged, tampered, replayed, downgraded, expired, rotated keys, records of any content)."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer
from typer.testing import CliRunner

from edge_agent.config import EdgeConfig, SelfTestSpec
from edge_agent.daemon import AgentDaemon
from edge_agent.scorers import RunningModel, ScorerSlot, load_lm, load_running
from edge_agent.updates import MAX_RELEASE_BYTES, ModelUpdater, UpdateFollower, UpdateOutcome, UpdateRefused, self_test
from models.edge.baselines import DriftZScore
from models.edge.registry import pack, release_for
from models.edge.releases import ReleaseSigner
from models.edge.scoring import Window
from models.edge.signing import generate_keypair, load_private_key
from precursor.contracts.messages import Heartbeat, ModelRelease, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.keys_cli import keys_command
from tests.fixtures_edge import TelemetryWriter, build_artifact, resign, wait_for

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
        "signing_key": trusted,
        "intruder_key": untrusted,
        "v1": v1,
        "v2": resign(v1, root / "artifact-0.2.0", "0.2.0", trusted),
        "v2-other": resign(v1, root / "artifact-0.2.0-other", "0.2.0", trusted),  # same version, other bytes
        "v3": resign(v1, root / "artifact-0.3.0-trusted", "0.3.0", trusted),
        "intruder": resign(v1, root / "artifact-0.3.0", "0.3.0", untrusted),
        "blind": build_artifact(root, "0.4.0", trusted, ("flow", "rpm", "torque")),
    }


def signer(artifacts: dict[str, Path], key: str = "signing_key", **options: object) -> ReleaseSigner:
    """What the flows sign releases with."""
    return ReleaseSigner(load_private_key(artifacts[key]), **options)  # type: ignore[arg-type]


def signed(artifacts: dict[str, Path], name: str, **changes: object) -> ModelRelease:
    """The release of artifact ``name`` (with ``changes``), signed now by the trusted release key."""
    return signer(artifacts)(release_for(artifacts[name]).model_copy(update=changes))


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


def outcome_of(updater: ModelUpdater | None, release: ModelRelease) -> UpdateOutcome:
    assert updater is not None
    wait_for(lambda: any(o.release == release for o in updater.outcomes), 20, what=f"{release.version} handled")
    return [o for o in updater.outcomes if o.release == release][-1]


def refused(daemon: AgentDaemon, release: ModelRelease) -> str:
    outcome = outcome_of(daemon.updater, release)
    assert not outcome.applied
    assert daemon.slot.running.scorer.version == "0.1.0"  # the old model keeps serving
    return outcome.reason


def publish_raw(settings: KafkaSettings, key: bytes, value: bytes) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all", max_request_size=2 << 20)
    producer.send(settings.topics.model_updates, key=key, value=value).get(timeout=30)
    producer.close()


@pytest.mark.integration
def test_bad_releases_are_refused_and_a_good_one_runs_within_10_s_shown_in_the_heartbeat(
    agent: AgentDaemon, kafka_settings: KafkaSettings, artifacts: dict[str, Path]
) -> None:
    wait_for(lambda: agent.agent.stats.predictions >= 8, 30, what="the first model predicting")
    assert agent.slot.running.scorer.version == "0.1.0"

    intruder = signer(artifacts, "intruder_key")(release_for(artifacts["intruder"]))
    publish(kafka_settings, intruder)
    reason = refused(agent, intruder)
    assert "signature check failed" in reason and "not a trusted key" in reason

    forged = signed(artifacts, "v2", signature=release_for(artifacts["v1"]).signature)
    publish(kafka_settings, forged)
    assert "does not match the signed data" in refused(agent, forged)

    wrong_hash = signed(artifacts, "v2", sha256="ab" * 32)
    publish(kafka_settings, wrong_hash)
    assert "hash check failed" in refused(agent, wrong_hash)

    blind = signed(artifacts, "blind")
    publish(kafka_settings, blind)
    reason = refused(agent, blind)
    assert "self-test" in reason and "min_sensor_coverage" in reason

    # Junk on the topic is skipped with a logged reason, and the follower goes on.
    assert agent.follower is not None
    skipped = agent.follower.records_skipped
    for n, junk in enumerate([b"{not json", b'{"version": [1]}', b"9" * 5000, b"[" * 100_000, b"x" * 900_000]):
        publish_raw(kafka_settings, f"junk-{n}".encode(), junk)
    wait_for(lambda: agent.follower.records_skipped >= skipped + 5, 20, what="junk skipped")  # type: ignore[union-attr]
    assert agent.follower.is_alive()

    good = signed(artifacts, "v2")
    tampered = good.model_copy(update={"artifact_uri": artifacts["intruder"].as_uri()})  # the genuine, redirected
    publish(kafka_settings, tampered)
    assert "signature check failed" in refused(agent, tampered)
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
        self.scored = 0

    def score(self, w: Window) -> dict[str, float]:
        return self.score_many([w])[0]

    def score_many(self, windows: list[Window]) -> list[dict[str, float]]:
        if self.fail:
            raise RuntimeError("ONNX went away")
        time.sleep(self.delay_s)  # a slow model, for the self-test's time limit
        self.scored += len(windows)
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
    scorer = FakeScorer()
    # Two of its three sensors are enough (min_sensor_coverage 0.5); it raises only on a refusal.
    self_test(scorer, [window(("temp", "vib"))] * 3, sensors=("temp", "vib", "flow"), spec=SelfTestSpec())
    assert scorer.scored == 3  # every recent window went through the model


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
    slot = ScorerSlot(RunningModel(DriftZScore()), state_file=config.state_dir / "models" / "current.json")
    return ModelUpdater(config, slot, lambda: [window(SENSORS)] * 4)


def test_a_packed_archive_is_fetched_verified_and_swapped_in(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    archive = pack(artifacts["v2"], tmp_path / "v2.tar.gz")
    updater = updater_for(tmp_path, artifacts)
    release = signer(artifacts)(release_for(archive))
    outcome = updater.apply(release)
    assert outcome.applied, outcome.reason
    assert updater.slot.running.scorer.version == "0.2.0" and updater.slot.previous is not None
    repeat = updater.apply(release)
    assert not repeat.applied and "a repeat of the release accepted for target 'fleet'" in repeat.reason
    # It then fails while running: rolled back, and its release is not taken again (also after a restart).
    updater.slot.on_rollback = updater.model_failed
    assert updater.slot.rollback("RuntimeError: session lost")
    assert updater.slot.running.scorer.name == "drift-zscore"
    again = updater_for(tmp_path, artifacts).apply(signer(artifacts)(release_for(archive)))
    assert not again.applied and "failed while running: RuntimeError: session lost" in again.reason


def test_releases_for_others_too_big_or_missing_are_skipped_or_refused(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    updater = updater_for(tmp_path, artifacts, max_bytes=1000)
    good = signed(artifacts, "v2")
    assert "target 'site-9'" in updater.apply(good.model_copy(update={"target": "site-9"})).reason
    assert (
        updater.apply(good.model_copy(update={"canary_edges": ["edge-other"]})).reason
        == "a canary release for other edges"
    )
    assert "over updates.max_bytes=1000" in updater.apply(good).reason
    roomy = updater_for(tmp_path / "roomy", artifacts)
    gone = signed(artifacts, "v2", artifact_uri=(tmp_path / "nowhere").as_uri(), sha256="cd" * 32)
    assert "no such file or folder" in roomy.apply(gone).reason
    assert roomy.slot.running.scorer.name == "drift-zscore"


# --- releases that must not get in -----------------------------------------------------------------------------------


def test_an_older_release_sent_later_is_refused_naming_both_versions(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    sign = signer(artifacts)
    v1 = sign(release_for(artifacts["v1"]))  # issued first: validly signed, and old
    v3 = sign(release_for(artifacts["v3"]))
    updater = updater_for(tmp_path, artifacts)
    assert updater.apply(v3).applied
    replayed = updater.apply(v1)
    assert not replayed.applied
    assert "replayed or stale: release 0.1.0" in replayed.reason and "older than release 0.3.0" in replayed.reason
    assert updater.slot.running.scorer.version == "0.3.0"
    downgrade = updater.apply(sign(release_for(artifacts["v1"])))  # signed again, later: still a way back
    assert not downgrade.applied
    assert "downgrade: version 0.1.0 is older than version 0.3.0" in downgrade.reason
    # The ledger survives a restart.
    assert "replayed or stale" in updater_for(tmp_path, artifacts).apply(v1).reason
    # Going back takes a release signed as a rollback (what the staged rollout publishes).
    back = updater.apply(sign(release_for(artifacts["v1"]).model_copy(update={"rollback": True})))
    assert back.applied, back.reason
    assert updater.slot.running.scorer.version == "0.1.0"
    assert "replayed or stale" in updater.apply(v3).reason  # and the older 0.3.0 release cannot come back either


def test_an_edge_installed_with_a_model_takes_no_older_release_of_it_before_any_release(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    updater = updater_for(tmp_path, artifacts)
    updater.slot.swap(load_lm(artifacts["v3"], updater.config.model, updater.trusted_keys))  # as configured
    refused = updater.apply(signed(artifacts, "v1"))
    assert not refused.applied
    assert "downgrade: version 0.1.0 is older than version 0.3.0, running here" in refused.reason
    assert updater.slot.running.scorer.version == "0.3.0"


def test_a_refused_tampered_copy_never_shadows_the_genuine_release(
    tmp_path: Path, artifacts: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    genuine = signed(artifacts, "v2")
    bad_bytes = shutil.copytree(artifacts["v2"], tmp_path / "tampered")
    with (bad_bytes / "precursor.json").open("a") as f:
        f.write(" ")
    tampered = genuine.model_copy(update={"artifact_uri": bad_bytes.as_uri()})  # same sha256, key and signatures
    updater = updater_for(tmp_path, artifacts)
    assert not updater.apply(tampered).applied
    with caplog.at_level(logging.INFO, logger="precursor.edge.updates"):
        outcome = updater.apply(genuine)
    assert outcome.applied, outcome.reason
    assert updater.slot.running.scorer.version == "0.2.0"


def test_a_genuine_release_that_failed_is_remembered_by_its_own_digest_and_skipped_with_a_log_line(
    tmp_path: Path, artifacts: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    blind = signed(artifacts, "blind")
    updater = updater_for(tmp_path, artifacts)
    assert "self-test" in updater.apply(blind).reason
    with caplog.at_level(logging.INFO, logger="precursor.edge.updates"):
        again = updater_for(tmp_path, artifacts).apply(blind)  # after a restart too
    assert not again.applied and again.reason.startswith("refused before: precursor-lm 0.4.0: self-test")
    assert any("skipped: refused before" in r.getMessage() for r in caplog.records)
    assert not list((tmp_path / "state" / "models").glob("*0.4.0*"))  # not fetched again


def test_every_skip_is_logged_with_its_reason(
    tmp_path: Path, artifacts: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    good = signed(artifacts, "v2")
    updater = updater_for(tmp_path, artifacts)
    assert updater.apply(good).applied
    with caplog.at_level(logging.INFO, logger="precursor.edge.updates"):
        outcomes = [
            updater.apply(good.model_copy(update={"target": "site-9"})),
            updater.apply(good.model_copy(update={"canary_edges": ["edge-other"]})),
            updater.apply(good),
            updater.apply(signed(artifacts, "v2", canary_edges=["edge-u"])),  # the same model, a newer release
        ]
    messages = [r.getMessage() for r in caplog.records]
    for outcome in outcomes:
        assert not outcome.applied
        assert any(outcome.reason in m for m in messages), (outcome.reason, messages)
    assert outcomes[3].reason == "already running"


def test_forged_replayed_downgraded_expired_and_unsigned_releases_are_refused_then_a_newer_one_applies(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    sign = signer(artifacts)
    v1 = sign(release_for(artifacts["v1"]))
    v2 = sign(release_for(artifacts["v2"]))
    updater = updater_for(tmp_path, artifacts)
    assert updater.apply(v2).applied
    reasons = {
        "forged": updater.apply(sign(release_for(artifacts["v3"])).model_copy(update={"version": "9.9.9"})).reason,
        "intruder": updater.apply(signer(artifacts, "intruder_key")(release_for(artifacts["v3"]))).reason,
        "unsigned": updater.apply(release_for(artifacts["v3"])).reason,
        "replayed": updater.apply(v1).reason,
        "downgraded": updater.apply(sign(release_for(artifacts["v1"]))).reason,
        "same version, other bytes": updater.apply(sign(release_for(artifacts["v2-other"]))).reason,
        "expired": updater.apply(
            signer(artifacts, validity=timedelta(hours=1), clock=lambda: datetime.now(UTC) - timedelta(hours=2))(
                release_for(artifacts["v3"])
            )
        ).reason,
    }
    assert "signature check failed" in reasons["forged"] and "does not match the signed data" in reasons["forged"]
    assert "signature check failed" in reasons["intruder"] and "not a trusted key" in reasons["intruder"]
    assert "is not signed" in reasons["unsigned"]
    assert "replayed or stale: release 0.1.0" in reasons["replayed"] and "release 0.2.0" in reasons["replayed"]
    assert "downgrade: version 0.1.0 is older than version 0.2.0" in reasons["downgraded"]
    assert "version 0.2.0 is accepted for target 'fleet' with artifact" in reasons["same version, other bytes"]
    assert reasons["expired"].startswith("expired: release precursor-lm 0.3.0 expired at")
    assert updater.slot.running.scorer.version == "0.2.0"
    newer = updater.apply(sign(release_for(artifacts["v3"])))
    assert newer.applied, newer.reason
    assert updater.slot.running.scorer.version == "0.3.0"


def test_a_fetch_that_failed_is_not_remembered_and_the_release_applies_once_the_artifact_is_there(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    later = tmp_path / "published-later"
    release = signed(artifacts, "v2", artifact_uri=later.as_uri())
    updater = updater_for(tmp_path, artifacts)
    first = updater.apply(release)
    assert not first.applied and first.retry and "no such file or folder" in first.reason
    shutil.copytree(artifacts["v2"], later)
    assert updater.apply(release).applied


def test_keys_rotate_by_the_documented_command_and_the_old_key_is_refused_after(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    app = typer.Typer()
    app.command()(keys_command)
    old_key = artifacts["signing_key"]
    result = CliRunner().invoke(app, [str(tmp_path / "keys"), "--name", "release-2", "--rotate-from", str(old_key)])
    assert result.exit_code == 0, result.output
    new_key = tmp_path / "keys" / "release-2.key"
    new_signer = ReleaseSigner.from_key_file(new_key)  # picks up keys/keyring.json beside it
    v3_new = resign(artifacts["v1"], tmp_path / "artifact-0.3.0-new-key", "0.3.0", new_key)
    v4_old = resign(artifacts["v1"], tmp_path / "artifact-0.4.0-old-key", "0.4.0", old_key)

    updater = updater_for(tmp_path, artifacts)  # configured with the old key only
    assert updater.apply(signed(artifacts, "v2")).applied  # the old key signs, before the rotation
    moved = updater.apply(new_signer(release_for(v3_new)))
    assert moved.applied, moved.reason
    assert updater.trust.version == 1 and set(updater.trusted_keys) == {new_signer.key_id}
    assert "not a trusted key" in updater.apply(signer(artifacts)(release_for(v4_old))).reason
    # A restart keeps the rotation: the model the new key signed runs again, and the old key stays revoked although
    # the config still names it.
    running, _ = load_running(updater.config.model, updater.config.state_dir / "models" / "current.json")
    assert (running.scorer.version, running.sha256) == ("0.3.0", moved.release.sha256)
    restarted = updater_for(tmp_path, artifacts)
    assert restarted.trust.version == 1
    assert "not a trusted key" in restarted.apply(signer(artifacts)(release_for(v4_old))).reason
    # A rotation the keys trusted now did not sign moves nothing.
    fake = tmp_path / "fake"
    fake_result = CliRunner().invoke(app, [str(fake), "--name", "x", "--rotate-from", str(artifacts["intruder_key"])])
    assert fake_result.exit_code == 0, fake_result.output
    forged_chain = ReleaseSigner.from_key_file(fake / "x.key")(release_for(v3_new))
    fresh = updater_for(tmp_path / "fresh", artifacts)
    assert "key rotation refused" in fresh.apply(forged_chain).reason
    assert fresh.trust.version == 0


# --- whatever the topic holds ----------------------------------------------------------------------------------------


def _release_shaped(values: dict[str, object]) -> bytes:
    return json.dumps(values, default=str).encode()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
RELEASE_FIELDS = list(ModelRelease.model_fields)
JUNK = st.one_of(
    st.binary(max_size=2048),
    st.text(max_size=1000).map(str.encode),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(RELEASE_FIELDS), JSON_VALUES, max_size=len(RELEASE_FIELDS)).map(_release_shaped),
    st.integers(MAX_RELEASE_BYTES - 10, 3 * MAX_RELEASE_BYTES).map(lambda n: b"x" * n),  # around and over 1 MiB
    st.integers(4_000, 60_000).map(lambda n: b'{"size_bytes": ' + b"9" * n + b"}"),  # past Python's int digits
    st.integers(500, 200_000).map(lambda n: b'{"keyring": ' + b"[" * n),  # nested past the recursion limit
)


def test_the_follower_outlives_any_record_and_then_applies_a_genuine_release(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    updater = updater_for(tmp_path, artifacts)
    follower = UpdateFollower(updater.config, updater, threading.Event())
    genuine = signed(artifacts, "v2")
    wrong_types = [
        {**genuine.model_dump(mode="json"), field: value}
        for field in RELEASE_FIELDS
        for value in ([1], {"a": 1}, 10**30, -1, "", None, 1.5)
    ]

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(record=st.one_of(JUNK, st.sampled_from(wrong_types).map(lambda d: json.dumps(d).encode())))
    def feed(record: bytes) -> None:
        outcome = follower.handle(record)  # must not raise, whatever the record
        assert outcome is None or not outcome.applied
        assert updater.slot.running.scorer.name == "drift-zscore"

    feed()
    assert follower.records_skipped > 0
    outcome = follower.handle(encode(genuine))
    assert outcome is not None and outcome.applied, outcome
    assert updater.slot.running.scorer.version == "0.2.0"
