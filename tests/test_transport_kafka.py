"""Kafka with TLS, SASL/SCRAM-SHA-512 and ACLs: a real broker, real kafka-python clients, and clients configured only
through ``PRECURSOR_KAFKA_*`` settings. An edge with its credentials gets its predictions to the pipeline; a wrong
password, an untrusted certificate and a plaintext client are refused; an edge cannot write what it does not own."""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import GroupAuthorizationFailedError, KafkaError, TopicAuthorizationFailedError
from pydantic import SecretStr, ValidationError

from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon
from infra.kafka_admin import KafkaAccessError, add_scram_users, check_access, edge_acls, ensure_topics, grant_acls
from infra.kafka_broker import BrokerError, BrokerSecurity, LocalKafka
from infra.processes import free_ports, process_cmdline
from pipelines.kafka_io import KafkaRecord, ReadPartitionRange, plan_ranges
from precursor.contracts.messages import Prediction, decode
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import Topics
from tests.conftest import shared_kafka_lib_dir
from tests.fixtures_edge import wait_for
from tests.fixtures_tls import TestCA

pytestmark = pytest.mark.integration

EDGE_USER = "edge-plant-a"
EDGE_GROUP = "site-a.edge.edge-plant-a"
# Random, so that finding one in a log can only mean it leaked.
ADMIN_PASSWORD = f"admin-{secrets.token_urlsafe(12)}"
EDGE_PASSWORD = f"edge-{secrets.token_urlsafe(12)}"
OWN, OTHER = Topics("site-a"), Topics("site-b")
T0 = 1_767_225_600


@dataclass(frozen=True)
class SecuredKafka:
    broker: LocalKafka
    ca: TestCA
    impostor: TestCA


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """One SASL_SSL broker for the module: two tenants' topics, and one edge user with the edge's ACLs on site-a."""
    directory = tmp_path_factory.mktemp("secured-kafka")
    ca = TestCA(directory / "ca")
    issued = ca.issue("precursor-broker")
    port, controller_port = free_ports(2)
    broker = LocalKafka(
        state_dir=directory / "state",
        port=port,
        controller_port=controller_port,
        lib_dir=shared_kafka_lib_dir(),
        topic_prefix=OWN.prefix,
        partitions=2,
        security=BrokerSecurity(
            ca_file=ca.cert_file,
            cert_file=issued.cert_file,
            key_file=issued.key_file,
            admin_password=SecretStr(ADMIN_PASSWORD),
        ),
    )
    broker.up(timeout_s=120)
    try:
        admin = broker.kafka_settings()
        ensure_topics(admin, OTHER.specs(2))
        add_scram_users(admin, {EDGE_USER: SecretStr(EDGE_PASSWORD)})
        grant_acls(admin, edge_acls(OWN, EDGE_USER, EDGE_GROUP))
        yield SecuredKafka(broker, ca, TestCA(directory / "impostor", "impostor-ca"))
    finally:
        broker.down()


EnvSettings = Callable[..., KafkaSettings]


@pytest.fixture
def edge_settings(secured: SecuredKafka, monkeypatch: pytest.MonkeyPatch) -> EnvSettings:
    """KafkaSettings as an edge reads them: from PRECURSOR_KAFKA_* variables (an override of None unsets one)."""

    def settings(**overrides: str | None) -> KafkaSettings:
        values: dict[str, str | None] = {
            "BOOTSTRAP_SERVERS": secured.broker.bootstrap,
            "TOPIC_PREFIX": OWN.prefix,
            "SECURITY_PROTOCOL": "SASL_SSL",
            "SASL_MECHANISM": "SCRAM-SHA-512",
            "SASL_PLAIN_USERNAME": EDGE_USER,
            "SASL_PLAIN_PASSWORD": EDGE_PASSWORD,
            "SSL_CAFILE": str(secured.ca.cert_file),
            "REQUEST_TIMEOUT_MS": "5000",
        }
        for key, value in (values | overrides).items():
            if value is None:
                monkeypatch.delenv(f"PRECURSOR_KAFKA_{key}", raising=False)
            else:
                monkeypatch.setenv(f"PRECURSOR_KAFKA_{key}", value)
        return KafkaSettings()

    return settings


def _decode_prediction(record: KafkaRecord) -> Prediction:
    assert record.value is not None
    return decode(Prediction, record.value)


def _produce(settings: KafkaSettings, topic: str) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), max_block_ms=5_000, bootstrap_timeout_ms=3_000)
    try:
        producer.send(topic, key=b"k", value=b"{}").get(timeout=10)
    finally:
        producer.close(timeout=5)


def test_an_edge_agent_with_its_credentials_publishes_predictions_that_the_pipeline_reads(
    secured: SecuredKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole edge path (replay, windows, scorer, outbox, sender) configured as an operator would: the kafka
    section of its YAML file, the password from a variable, the CA file relative to the config."""
    (tmp_path / "ca.pem").write_bytes(secured.ca.cert_file.read_bytes())
    rows = ["timestamp,machine_id,temp"] + [f"{T0 + 60 * minute},m1,{20 + minute % 7}" for minute in range(31)]
    (tmp_path / "telemetry.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "edge.yaml").write_text(
        f"edge_id: {EDGE_USER}\n"
        f"kafka: {{bootstrap_servers: '{secured.broker.bootstrap}', topic_prefix: {OWN.prefix},\n"
        "        security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512,\n"
        f"        sasl_plain_username: {EDGE_USER}, ssl_cafile: ca.pem}}\n"
        "sources: [{type: replay, telemetry: telemetry.csv}]\n"
        "window: {length: 10m, every: 5m, min_points: 2}\n"
        "health: {enabled: false}\n"
        "exit_when_sources_end: false\n"
        "state_dir: state\n"
    )
    monkeypatch.setenv("PRECURSOR_KAFKA_SASL_PLAIN_PASSWORD", EDGE_PASSWORD)
    daemon = AgentDaemon(EdgeConfig.load(tmp_path / "edge.yaml"))
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: daemon.agent.stats.readings == 31 and daemon.outbox.depth == 0, 30, what="all sent")
    finally:
        daemon.request_stop()
        runner.join(20)
    assert daemon.sender is not None and daemon.sender.last_error is None

    pipeline = secured.broker.kafka_settings()  # the pipeline runs as the admin
    reader = ReadPartitionRange(pipeline)
    reader.setup()
    try:
        records = [rec for r in plan_ranges(pipeline, OWN.predictions, {}) for rec in reader.process(r)]
    finally:
        reader.teardown()
    windows = [p.window_end.timestamp() - T0 for p in map(_decode_prediction, records) if p.edge_id == EDGE_USER]
    assert sorted(windows) == [300.0 * k for k in range(1, 7)]


def test_an_edge_reads_model_releases_in_its_own_consumer_group_and_no_other(
    secured: SecuredKafka, edge_settings: EnvSettings
) -> None:
    release_key = uuid.uuid4().hex.encode()
    producer = KafkaProducer(**secured.broker.kafka_settings().client_kwargs())
    producer.send(OWN.model_updates, key=release_key, value=b"release").get(timeout=10)
    producer.close()

    def read(group: str) -> list[bytes | None]:
        consumer = KafkaConsumer(
            OWN.model_updates,
            **edge_settings().client_kwargs(),
            group_id=group,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5_000,
        )
        try:
            return [record.key for record in consumer]
        finally:
            consumer.close()

    assert release_key in read(EDGE_GROUP)
    with pytest.raises(GroupAuthorizationFailedError):
        read("site-a.pipeline")


def test_a_wrong_password_is_refused(edge_settings: EnvSettings) -> None:
    wrong = edge_settings(SASL_PLAIN_PASSWORD=f"wrong-{secrets.token_urlsafe(8)}")
    with pytest.raises(KafkaAccessError, match=r"invalid credentials|wrong password") as refused:
        check_access(wrong, timeout_s=3)
    assert wrong.sasl_plain_password is not None
    assert wrong.sasl_plain_password.get_secret_value() not in str(refused.value)
    with pytest.raises(KafkaError):  # a real producer gets nowhere either, and says so within its bootstrap time
        _produce(wrong, OWN.predictions)


def test_a_client_that_does_not_trust_the_broker_certificate_is_refused(
    secured: SecuredKafka, edge_settings: EnvSettings
) -> None:
    untrusting = edge_settings(SSL_CAFILE=str(secured.impostor.cert_file))
    with pytest.raises(KafkaAccessError, match="CERTIFICATE_VERIFY_FAILED"):
        check_access(untrusting, timeout_s=3)
    with pytest.raises(KafkaError):
        _produce(untrusting, OWN.predictions)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_a_client_without_tls_cannot_connect_to_the_tls_listener(edge_settings: EnvSettings, protocol: str) -> None:
    plain = edge_settings(SECURITY_PROTOCOL=protocol, SSL_CAFILE=None)
    with pytest.raises(KafkaAccessError, match=f"over {protocol}"):
        check_access(plain, timeout_s=3)


@pytest.mark.parametrize(
    "topic",
    [OWN.model_updates, OWN.alerts, OWN.deadletter, OTHER.predictions, OTHER.heartbeats],
    ids=["model-updates", "alerts", "deadletter", "other-tenant-predictions", "other-tenant-heartbeats"],
)
def test_the_broker_refuses_an_edge_writing_a_topic_it_does_not_own(edge_settings: EnvSettings, topic: str) -> None:
    settings = edge_settings()
    _produce(settings, OWN.heartbeats)  # the same login may write its own topics: the refusal is about the topic
    with pytest.raises(TopicAuthorizationFailedError):
        _produce(settings, topic)


def test_an_edge_cannot_read_the_predictions_it_writes(edge_settings: EnvSettings) -> None:
    settings = edge_settings()
    _produce(settings, OWN.predictions)
    reader = ReadPartitionRange(settings, stall_timeout_s=10)
    reader.setup()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            for partition_range in plan_ranges(settings, OWN.predictions, {}):
                list(reader.process(partition_range))
    finally:
        reader.teardown()


def test_no_password_reaches_a_log_a_repr_or_a_command_line(
    secured: SecuredKafka, edge_settings: EnvSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    settings = edge_settings()
    _produce(settings, OWN.events)
    with pytest.raises(KafkaAccessError) as refused:
        check_access(edge_settings(SASL_PLAIN_PASSWORD=EDGE_PASSWORD + "x"), timeout_s=3)
    broker = secured.broker
    pid = broker.status().pid
    assert pid is not None
    seen = {
        "client logs": caplog.text,
        "refusal": str(refused.value),
        "settings repr": repr(settings) + repr(broker.kafka_settings()),
        "broker repr": repr(broker) + repr(broker.model_dump()),
        "broker command line": process_cmdline(pid) or "",
        **{f"broker log {p.name}": p.read_text(errors="replace") for p in broker.logs_dir.iterdir() if p.is_file()},
    }
    for where, text in seen.items():
        assert ADMIN_PASSWORD not in text, where
        assert EDGE_PASSWORD not in text, where
    # The broker's own login has to be in its config: that file, and the key store, are its owner's alone.
    assert broker.properties_file.stat().st_mode & 0o077 == 0
    assert broker.keystore_file.stat().st_mode & 0o077 == 0
    assert not (broker.home / "format.args").exists()


def test_tls_files_in_an_edge_config_are_relative_to_the_file_and_variables_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECURSOR_KAFKA_SSL_CERTFILE", "from-env/client.pem")
    config_file = tmp_path / "edge.yaml"
    config_file.write_text(
        "edge_id: e1\n"
        "kafka: {security_protocol: SSL, ssl_cafile: certs/ca.pem}\n"
        "sources: [{type: replay, telemetry: t.csv}]\n"
    )
    kafka = EdgeConfig.load(config_file).kafka
    assert kafka.ssl_cafile == str(tmp_path / "certs" / "ca.pem")
    assert kafka.ssl_certfile == "from-env/client.pem"


def test_a_plaintext_storage_is_not_started_secured_nor_a_secured_one_open(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    issued = ca.issue("precursor-broker")
    security = BrokerSecurity(
        ca_file=ca.cert_file, cert_file=issued.cert_file, key_file=issued.key_file, admin_password=SecretStr("x" * 12)
    )
    port, controller_port = free_ports(2)
    plain = LocalKafka(state_dir=tmp_path / "state", port=port, controller_port=controller_port)
    plain.data_dir.mkdir(parents=True)
    (plain.data_dir / "meta.properties").write_text("node.id=1\n")  # formatted earlier, by a plaintext broker
    with pytest.raises(BrokerError, match="formatted for a PLAINTEXT broker, not SASL_SSL"):
        plain.model_copy(update={"security": security}).up(timeout_s=5)
    plain.listener_file.write_text("SASL_SSL")
    with pytest.raises(BrokerError, match="formatted for a SASL_SSL broker, not PLAINTEXT"):
        plain.up(timeout_s=5)


def test_a_settings_error_does_not_print_the_password(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as refused:
        KafkaSettings(security_protocol="SASL_SSL", sasl_plain_password="hunter2-hunter2")  # no mechanism
    assert "needs sasl_mechanism" in str(refused.value) and "hunter2" not in str(refused.value)
    ca = TestCA(tmp_path / "ca")
    with pytest.raises(ValidationError) as refused:
        BrokerSecurity(
            ca_file=ca.cert_file, cert_file=ca.cert_file, key_file=ca.cert_file, admin_password="hunter2\nhunter2"
        )
    assert "control characters" in str(refused.value) and "hunter2" not in str(refused.value)


def test_a_close_with_no_reason_still_counts_as_a_refusal_to_explain() -> None:
    """kafka-python may drop the broker's login refusal and log only "socket disconnected": that must still lead
    check_access to find out the failed phase, not to say "no answer in time"."""
    import logging

    from infra.kafka_admin import _BootstrapFailures

    failures = _BootstrapFailures()
    for text in ("<KafkaSSLTransport [127.0.0.1:1<-2]>: socket disconnected", "Bootstrap failed: KafkaTimeoutError"):
        failures.handle(logging.LogRecord("kafka.net.transport", logging.ERROR, __file__, 1, text, None, None))
    assert failures.reasons == ["<KafkaSSLTransport [127.0.0.1:1<-2]>: socket disconnected"]
