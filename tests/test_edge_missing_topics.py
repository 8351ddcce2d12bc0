"""An edge pointed at topics the cluster lacks says so once, clearly, keeps its outbox and sends once they exist.

The reproduction: kafka-python logged "Topic … not found in cluster metadata" many times a second, and nothing said
how to create the topics.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_agent.outbox import Outbox
from edge_agent.publisher import KafkaPublisher, TopicsMissing
from edge_agent.sender import OutboxSender
from infra.kafka_admin import admin_client, ensure_topics, missing_topics
from infra.kafka_broker import LocalKafka
from precursor.contracts.messages import Heartbeat
from precursor.contracts.settings import KafkaSettings

MISSING = "has no topic"
KAFKA_PYTHON_REPEAT = "not found in cluster metadata"


@pytest.fixture
def absent_settings(kafka_broker: LocalKafka) -> Iterator[KafkaSettings]:
    """The session broker under a prefix of this test's own whose topics do not exist (until a test makes them)."""
    settings = kafka_broker.kafka_settings(topic_prefix=f"absent{uuid.uuid4().hex[:8]}")
    yield settings
    with admin_client(settings, timeout_s=10) as admin:
        present = [spec.name for spec in settings.topics.specs() if spec.name in set(admin.list_topics())]
        if present:
            admin.delete_topics(present, raise_errors=False)


def wait_until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.05)


def heartbeat(outbox: Outbox) -> None:
    outbox.stage(Heartbeat(edge_id="e1", seq=outbox.next_seq(), timestamp="2026-01-01T00:00:00Z",
                           model_name="m", model_version="1"))  # fmt: skip
    outbox.commit()


def ours(caplog: pytest.LogCaptureFixture, text: str, settings: KafkaSettings) -> list[logging.LogRecord]:
    """The records saying ``text`` of this test's topics. kafka-python's loggers are process-wide: a producer an
    earlier test in this worker left to close can still log its own topics here."""
    return [r for r in caplog.records if text in r.getMessage() and f"{settings.topic_prefix}." in r.getMessage()]


def test_missing_topics_are_named_once_and_the_outbox_is_sent_once_they_exist(
    absent_settings: KafkaSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outbox = Outbox(tmp_path / "state.db", max_bytes=10**6)
    heartbeat(outbox)
    sender = OutboxSender(outbox, absent_settings, send_timeout_s=5.0)
    sender.start()
    try:
        wait_until(lambda: sender.failures >= 4, 20)  # the start check and three retries, backing off
        said = ours(caplog, MISSING, absent_settings)
        assert len(said) == 1 and said[0].levelno == logging.ERROR
        topics = absent_settings.topics
        for name in (topics.predictions, topics.events, topics.heartbeats):
            assert name in said[0].getMessage()
        assert "precursor kafka up" in said[0].getMessage()
        assert [r.getMessage() for r in ours(caplog, KAFKA_PYTHON_REPEAT, absent_settings)] == []
        assert sender.broker_reachable is False and sender.last_error is not None and MISSING in sender.last_error
        assert outbox.depth == 1  # kept, not dropped

        ensure_topics(absent_settings, absent_settings.topics.specs())
        wait_until(lambda: outbox.depth == 0, 30)
        assert sender.broker_reachable is True and sender.last_error is None
        assert len(ours(caplog, MISSING, absent_settings)) == 1
    finally:
        sender.stop()
        sender.join(20)
        outbox.close()


def test_the_publisher_refuses_missing_topics_with_a_clear_error(absent_settings: KafkaSettings) -> None:
    with pytest.raises(TopicsMissing, match=rf"{absent_settings.topics.heartbeats}.*precursor kafka up") as raised:
        KafkaPublisher(absent_settings)
    topics = absent_settings.topics
    assert raised.value.topics == sorted([topics.predictions, topics.events, topics.heartbeats])


def test_topics_deleted_under_a_running_sender_are_named_without_a_flood(
    kafka_settings: KafkaSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outbox = Outbox(tmp_path / "state.db", max_bytes=10**6)
    sender = OutboxSender(outbox, kafka_settings, send_timeout_s=5.0)
    sender.start()
    try:
        heartbeat(outbox)
        wait_until(lambda: outbox.depth == 0, 30)
        names = [spec.name for spec in kafka_settings.topics.specs()]
        with admin_client(kafka_settings, timeout_s=10) as admin:
            admin.delete_topics(names)
        # The broker applies a deletion a moment after the controller accepts it: a heartbeat sent in between is
        # acknowledged into the doomed log, and the sender rightly reports nothing.
        wait_until(lambda: missing_topics(kafka_settings, names) == sorted(names), 10)
        heartbeat(outbox)  # the producer now waits for a topic the cluster has no more
        wait_until(lambda: sender.last_error is not None and MISSING in sender.last_error, 40)
        repeats = ours(caplog, KAFKA_PYTHON_REPEAT, kafka_settings)
        assert len(repeats) <= 1, len(repeats)  # one line for the heartbeats topic, not ten a second
        assert len(ours(caplog, MISSING, kafka_settings)) == 1
        assert outbox.depth == 1
    finally:
        sender.stop()
        sender.join(20)
        outbox.close()
