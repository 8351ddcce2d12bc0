"""Unit test of topic creation's retry while a just-started cluster settles (no broker: our own step is faked).

The real path is exercised by tests/test_kafka_cluster.py, which starts three real brokers through `precursor kafka
up --brokers 3`; the race itself (a node naming a controller it has no address for yet) cannot be forced there.
"""

from __future__ import annotations

import time

import pytest
from kafka.errors import UnknownBrokerIdError

from infra import kafka_admin
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import TopicSpec

SPECS = [TopicSpec("t.predictions", 3)]
SETTINGS = KafkaSettings(bootstrap_servers="127.0.0.1:1")


def test_topic_creation_asks_again_while_the_controller_is_not_known_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def settling_twice(*args: object) -> None:
        attempts.append(1)
        if len(attempts) <= 2:
            raise UnknownBrokerIdError(3)
        created = args[-1]
        assert isinstance(created, list)
        created.append("t.predictions")

    monkeypatch.setattr(kafka_admin, "_create_missing", settling_twice)
    ensured = kafka_admin.ensure_topics(SETTINGS, SPECS, timeout_s=5.0)
    assert ensured.created == ("t.predictions",) and len(attempts) == 3


def test_past_its_deadline_the_error_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    def never_settling(*args: object) -> None:
        raise UnknownBrokerIdError(3)

    monkeypatch.setattr(kafka_admin, "_create_missing", never_settling)
    started = time.monotonic()
    with pytest.raises(UnknownBrokerIdError):
        kafka_admin.ensure_topics(SETTINGS, SPECS, timeout_s=0.5)
    assert 0.5 <= time.monotonic() - started < 3.0
