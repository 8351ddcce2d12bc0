"""Shared fixtures. Services that tests talk to are real and started once per session on free ports."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.kafka_admin import admin_client, ensure_topics
from infra.kafka_broker import LocalKafka
from infra.processes import free_ports
from precursor.contracts.settings import KafkaSettings

REPO_ROOT = Path(__file__).resolve().parents[1]

# Fixture modules that test modules load with ``pytest_plugins``: a parallel worker may import one before pytest
# would rewrite its asserts, which then fail without saying what they compared.
pytest.register_assert_rewrite(*(f"tests.{path.stem}" for path in Path(__file__).parent.glob("fixtures_*.py")))


def shared_kafka_lib_dir() -> Path:
    """Where the developer's own broker keeps its jars, so a test session reuses them instead of copying 46 MB."""
    state_dir = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    return LocalKafka(state_dir=state_dir).jars_root


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real Kafka broker for the whole session, on free ports and its own state folder: never a developer's 9092."""
    port, controller_port = free_ports(2)
    broker = LocalKafka(
        state_dir=tmp_path_factory.mktemp("kafka-state"),
        port=port,
        controller_port=controller_port,
        lib_dir=shared_kafka_lib_dir(),
    )
    broker.up(timeout_s=120)
    yield broker
    broker.down()


@pytest.fixture
def kafka_settings(kafka_broker: LocalKafka) -> Iterator[KafkaSettings]:
    """Settings for the session broker with a topic prefix of this test's own, its topics created and then deleted."""
    settings = kafka_broker.kafka_settings(topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    specs = settings.topics.specs()
    ensure_topics(settings, specs)
    yield settings
    # Deleted so that a long session does not pile up thousands of partitions on one small broker.
    with admin_client(settings, timeout_s=10) as admin:
        admin.delete_topics([spec.name for spec in specs], raise_errors=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Beam stops its cached job servers (Prism, Flink) only at interpreter exit, and says so through whatever
    logging handlers are installed: by then the console handler Prefect added writes to pytest's closed capture
    stream, and logging would print a traceback per server. The servers still stop; only that report is dropped."""
    import logging

    logging.raiseExceptions = False
