"""Sending what the agent finds to Kafka, with ``acks=all``: a send counts only once every in-sync replica has it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kafka import KafkaProducer
from kafka.producer.future import FutureRecordMetadata

from infra.kafka_admin import check_reachable, missing_topics
from precursor.contracts.messages import EdgeEvent, Heartbeat, Message, Prediction, TelemetrySummary, encode
from precursor.contracts.settings import KafkaSettings


class Sink(Protocol):
    """Where an agent's messages go. The Kafka publisher in production; a list in unit tests."""

    def send(self, message: Prediction | EdgeEvent | Heartbeat | TelemetrySummary) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class TopicsMissing(ConnectionError):
    """The broker answers, but some topics the edge writes to are not there; the message says how to create them."""

    def __init__(self, settings: KafkaSettings, topics: Sequence[str]) -> None:
        self.topics = list(topics)
        super().__init__(
            f"Kafka at {settings.bootstrap_servers} has no topic {', '.join(self.topics)} (topic prefix "
            f"{settings.topic_prefix!r}). Create them: `precursor kafka up` creates every topic of its prefix on the "
            "local broker (PRECURSOR_KAFKA_TOPIC_PREFIX sets the prefix); on another cluster, e.g. "
            "`kafka-topics.sh --create --topic NAME`. Or set the prefix the cluster has (kafka.topic_prefix in the "
            "edge config, PRECURSOR_KAFKA_TOPIC_PREFIX)."
        )


def edge_topics(settings: KafkaSettings, *, summaries: bool = False) -> list[str]:
    """The topics an edge writes to; the telemetry topic only where it sends telemetry summaries (opt-in)."""
    topics = settings.topics
    return [topics.predictions, topics.events, topics.heartbeats] + ([topics.telemetry] if summaries else [])


def check_topics(settings: KafkaSettings, topics: Sequence[str], timeout_s: float = 5.0) -> None:
    """Raise :class:`TopicsMissing` naming every topic of ``topics`` the cluster lacks."""
    missing = missing_topics(settings, topics, timeout_s)
    if missing:
        raise TopicsMissing(settings, missing)


class KafkaPublisher:
    """Predictions, events and telemetry summaries keyed by machine_id, heartbeats by edge_id. ``flush`` raises if
    any send failed. ``summaries``: the edge sends telemetry summaries, so their topic must be there too."""

    def __init__(self, settings: KafkaSettings, *, linger_ms: int = 20, summaries: bool = False) -> None:
        check_reachable(settings.servers)
        check_topics(settings, edge_topics(settings, summaries=summaries))
        self.topics = settings.topics
        self._producer = KafkaProducer(
            **settings.client_kwargs(),
            acks="all",
            linger_ms=linger_ms,
            retries=2**31 - 1,
            max_in_flight_requests_per_connection=5,
        )
        self._pending: list[FutureRecordMetadata] = []
        self.sent = 0

    def _topic_and_key(self, message: Message) -> tuple[str, str]:
        if isinstance(message, Prediction):
            return self.topics.predictions, message.machine_id
        if isinstance(message, EdgeEvent):
            return self.topics.events, message.machine_id
        if isinstance(message, Heartbeat):
            return self.topics.heartbeats, message.edge_id
        if isinstance(message, TelemetrySummary):
            return self.topics.telemetry, message.machine_id
        raise TypeError(f"the edge does not publish {type(message).__name__} messages")

    def send(self, message: Prediction | EdgeEvent | Heartbeat | TelemetrySummary) -> None:
        topic, key = self._topic_and_key(message)
        self._pending.append(self._producer.send(topic, key=key.encode(), value=encode(message)))
        if len(self._pending) >= 10_000:
            self.flush()

    def flush(self) -> None:
        self._producer.flush()
        pending, self._pending = self._pending, []
        for future in pending:
            future.get(timeout=60)  # raises the send's error, if it had one
        self.sent += len(pending)

    def close(self) -> None:
        self.flush()
        self._producer.close()
