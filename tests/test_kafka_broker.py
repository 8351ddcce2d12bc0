"""The local broker: a real Kafka process, started from Maven-resolved jars, with the project's topics."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from infra.kafka_admin import admin_client, broker_reachable, ensure_topics
from infra.kafka_broker import BrokerError, LocalKafka
from infra.maven_jars import MissingToolError
from infra.processes import free_ports
from precursor.contracts.messages import Prediction, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import Topics, TopicSpec

pytestmark = pytest.mark.integration


def _spare_broker(state_dir: Path, broker: LocalKafka, **overrides: object) -> LocalKafka:
    port, controller_port = free_ports(2)
    settings = {"state_dir": state_dir, "port": port, "controller_port": controller_port, "lib_dir": broker.lib_dir}
    return LocalKafka(**{**settings, **overrides})


def test_up_twice_keeps_the_running_broker(kafka_broker: LocalKafka) -> None:
    first = kafka_broker.status()
    # A fresh object knows the broker only from the pid file, as a second `precursor kafka up` would.
    again = LocalKafka(**kafka_broker.model_dump()).up(timeout_s=30)
    assert first.running and first.pid is not None
    assert again.pid == first.pid
    assert int(kafka_broker.pid_file.read_text()) == first.pid


def test_status_reports_the_running_broker_and_its_topics(kafka_broker: LocalKafka) -> None:
    status = kafka_broker.status()
    assert status.running and status.reachable
    assert status.bootstrap == f"127.0.0.1:{kafka_broker.port}"
    assert status.state_dir == kafka_broker.state_dir
    assert {spec.name for spec in Topics(kafka_broker.topic_prefix).specs()} <= set(status.topics)


def test_topics_have_their_partitions_and_cleanup_policy(kafka_broker: LocalKafka) -> None:
    specs = Topics(kafka_broker.topic_prefix).specs(kafka_broker.partitions)
    with admin_client(kafka_broker.kafka_settings(), timeout_s=10) as admin:
        described = {topic["name"]: topic for topic in admin.describe_topics([spec.name for spec in specs])}
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, spec.name, ["cleanup.policy"]) for spec in specs],
            config_filter="all",
        )["topic"]
    for spec in specs:
        assert len(described[spec.name]["partitions"]) == spec.partitions, spec.name
        expected_policy = "compact" if spec.compacted else "delete"
        assert configs[spec.name]["cleanup.policy"]["value"] == expected_policy, spec.name
    assert any(spec.compacted for spec in specs)


def test_a_produced_prediction_is_consumed_back(kafka_settings: KafkaSettings) -> None:
    sent = Prediction(
        edge_id="edge-1",
        seq=1,
        machine_id="pump-7",
        window_start=datetime(2026, 1, 1, tzinfo=UTC),
        window_end=datetime(2026, 1, 1, 1, tzinfo=UTC),
        horizon_h=24,
        risk={"failure": 0.125},
        model_name="zscore",
        model_version="0.1.0",
    )
    topic = kafka_settings.topics.predictions
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    metadata = producer.send(topic, key=b"pump-7", value=encode(sent)).get(timeout=10)
    producer.close()

    consumer = KafkaConsumer(**kafka_settings.client_kwargs(), enable_auto_commit=False, consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(topic, metadata.partition)])
    consumer.seek(TopicPartition(topic, metadata.partition), metadata.offset)
    received = next(iter(consumer))
    consumer.close()

    assert received.key == b"pump-7"
    assert decode(Prediction, received.value) == sent


def test_ensure_topics_again_creates_nothing(kafka_settings: KafkaSettings) -> None:
    specs = kafka_settings.topics.specs()
    extra = TopicSpec(f"{kafka_settings.topic_prefix}.extra", 2)
    ensured = ensure_topics(kafka_settings, [*specs, extra])
    assert ensured.created == (extra.name,)
    assert set(ensured.existing) == {spec.name for spec in specs}


def test_ensure_topics_names_a_bad_spec(kafka_settings: KafkaSettings) -> None:
    with pytest.raises(ValueError, match=r"topic 'bad': partitions=0"):
        ensure_topics(kafka_settings, [TopicSpec("bad", 0)])


def test_broker_reachable_tells_a_broker_from_a_closed_port(kafka_broker: LocalKafka) -> None:
    (closed_port,) = free_ports(1)
    assert broker_reachable(kafka_broker.kafka_settings(), timeout_s=5)
    assert not broker_reachable(KafkaSettings(bootstrap_servers=f"127.0.0.1:{closed_port}"), timeout_s=1)


def test_down_stops_its_own_broker_and_leaves_others_running(kafka_broker: LocalKafka, tmp_path: Path) -> None:
    spare = _spare_broker(tmp_path / "spare", kafka_broker)
    spare_pid = spare.up(timeout_s=120).pid

    assert spare.down() is True

    assert spare_pid is not None and spare_pid != kafka_broker.status().pid
    assert not spare.status().running
    assert not spare.pid_file.exists()
    assert not broker_reachable(spare.kafka_settings(), timeout_s=1)
    assert kafka_broker.status().reachable


def test_down_ignores_a_pid_file_that_names_someone_else(kafka_broker: LocalKafka, tmp_path: Path) -> None:
    # A pid file can outlive its broker while the pid goes to another process: that process must survive.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    imposter = _spare_broker(tmp_path / "imposter", kafka_broker)
    try:
        for pid in (stranger.pid, kafka_broker.status().pid):
            imposter.home.mkdir(parents=True, exist_ok=True)
            imposter.pid_file.write_text(f"{pid}\n")
            assert imposter.down() is False
            assert not imposter.pid_file.exists()
        assert stranger.poll() is None
        assert kafka_broker.status().reachable
    finally:
        stranger.kill()
        stranger.wait()


def test_missing_java_is_named_with_what_to_install(kafka_broker: LocalKafka, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-jdk" / "bin" / "java"
    broker = _spare_broker(tmp_path / "state", kafka_broker, java_executable=str(missing))
    with pytest.raises(MissingToolError, match=r"no-such-jdk/bin/java' not found.*install a Java 17 runtime"):
        broker.up(timeout_s=5)
    assert not broker.pid_file.exists()


def test_missing_maven_is_named_when_jars_need_resolving(tmp_path: Path) -> None:
    broker = LocalKafka(state_dir=tmp_path, lib_dir=tmp_path / "empty-lib", maven_executable=str(tmp_path / "mvn"))
    with pytest.raises(MissingToolError, match=r"mvn' not found.*install Maven"):
        broker.resolve_jars()


def test_a_busy_port_is_refused_by_name(kafka_broker: LocalKafka, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy_port = squatter.getsockname()[1]
        broker = _spare_broker(tmp_path / f"state-{uuid.uuid4().hex[:6]}", kafka_broker, port=busy_port)
        with pytest.raises(BrokerError, match=rf"port={busy_port} on 127.0.0.1 is in use"):
            broker.up(timeout_s=5)
