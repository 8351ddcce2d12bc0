"""Unit test of the retry that topic creation and group offsets use while a just-started cluster settles.

No broker and no Kafka step faked: `settled` is given a plain callable that fails the way a settling cluster does.
The real path is exercised by tests/test_kafka_cluster.py, which starts three real brokers through `precursor kafka
up --brokers 3`; the race itself (a node naming a controller it has no address for yet) cannot be forced there.
"""

from __future__ import annotations

import time

import pytest
from kafka.errors import UnknownBrokerIdError

from infra.kafka_admin import _CONTROLLER_SETTLING, settled


def test_asks_again_while_the_controller_is_not_known_yet() -> None:
    attempts: list[int] = []

    def settling_twice() -> tuple[str, ...]:
        attempts.append(1)
        if len(attempts) <= 2:
            raise UnknownBrokerIdError(3)
        return ("t.predictions",)

    created = settled(settling_twice, _CONTROLLER_SETTLING, 5.0, "creating topics")
    assert created == ("t.predictions",) and len(attempts) == 3


def test_past_its_deadline_the_error_stands() -> None:
    def never_settling() -> None:
        raise UnknownBrokerIdError(3)

    started = time.monotonic()
    with pytest.raises(UnknownBrokerIdError):
        settled(never_settling, _CONTROLLER_SETTLING, 0.5, "creating topics")
    assert 0.5 <= time.monotonic() - started < 3.0


def test_other_errors_are_not_retried() -> None:
    attempts: list[int] = []

    def refused() -> None:
        attempts.append(1)
        raise ValueError("not a settling cluster")

    with pytest.raises(ValueError):
        settled(refused, _CONTROLLER_SETTLING, 5.0, "creating topics")
    assert len(attempts) == 1
