"""The sender thread: outbox -> Kafka (``acks=all``), deleting each message only once the broker acknowledged it.

A kafka-python producer without a broker blocks for its whole timeout before it says so, so the sender first checks
that some bootstrap server accepts a TCP connection, and backs off (0.5 s doubling to 10 s) while none does. A send
that fails or times out closes the producer (its buffered records are abandoned: they are still in the outbox) and
the next attempt starts fresh, resending from the oldest message. A resend carries the same ``(edge_id, seq)``, so
consumers drop it if the first attempt had in fact landed.

Before each producer is made (at start, and after every failure) the sender checks that the topics it writes to
exist: a producer pointed at a missing topic logs "not found in cluster metadata" many times a second and then
times out. A missing topic is said once, naming the topics and how to create them, and the sender keeps the
outbox and retries with the same backoff until they are there. A topic deleted while a producer runs is found by
the producer first: its repeats of that line are let through once a minute per topic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from edge_agent.outbox import Outbox, OutboxRow
from edge_agent.publisher import TopicsMissing, check_topics, edge_topics
from infra.kafka_admin import BrokerUnreachable, check_reachable
from precursor.contracts.settings import KafkaSettings

log = logging.getLogger("precursor.edge.sender")

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
# While there is nothing to send, the last send's success says nothing about the link now: probe it this often, so
# /healthz and heartbeats report an outage within seconds even on a quiet edge.
IDLE_PROBE_S = 2.0


class _RepeatedMissingTopic(logging.Filter):
    """kafka-python logs a topic missing from the cluster's metadata at every refresh (about ten a second) while a
    producer waits for it; one line a minute per topic says as much."""

    TEMPLATE = "Topic %s not found in cluster metadata"

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.TEMPLATE:
            return True
        topic = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
        now = time.monotonic()
        with self._lock:
            if topic in self._last and now - self._last[topic] < self.every_s:
                return False
            self._last[topic] = now
        return True


_MISSING_TOPIC_REPEATS = _RepeatedMissingTopic()


def topic_for(settings: KafkaSettings) -> Callable[[str], str]:
    topics = settings.topics
    by_kind = {
        "prediction": topics.predictions,
        "event": topics.events,
        "heartbeat": topics.heartbeats,
        "telemetry": topics.telemetry,
    }
    return by_kind.__getitem__


class OutboxSender(threading.Thread):
    def __init__(
        self,
        outbox: Outbox,
        settings: KafkaSettings,
        *,
        batch: int = 1000,
        send_timeout_s: float = 15.0,
        producer_factory: Callable[[], Any] | None = None,
        idle_probe_s: float = IDLE_PROBE_S,
        topics_check: Callable[[], None] | None = None,
        summaries: bool = False,
    ) -> None:
        """``producer_factory`` stands in for Kafka in unit tests; such a stand-in has no cluster to ask for topics,
        so then the topics are checked only by ``topics_check`` (which raises :class:`TopicsMissing`), if given.
        ``summaries``: the outbox holds telemetry summaries, so their topic is checked too."""
        super().__init__(name="outbox-sender", daemon=True)
        self.outbox = outbox
        self.settings = settings
        self.batch = batch
        self.send_timeout_s = send_timeout_s
        self.topic = topic_for(settings)
        self._topics = edge_topics(settings, summaries=summaries)
        self._producer_factory = producer_factory or self._new_producer
        if topics_check is None and producer_factory is None:
            topics_check = self._check_topics
        self._topics_check = topics_check
        self._reported_missing: list[str] | None = None
        logging.getLogger("kafka.cluster").addFilter(_MISSING_TOPIC_REPEATS)  # added once however many senders
        self._producer: Any = None
        self._stopping = threading.Event()
        self._backoff = MIN_BACKOFF_S
        self.sent = 0
        self.failures = 0
        self.broker_reachable: bool | None = None
        self.last_error: str | None = None
        self.last_success: float | None = None
        self._idle = threading.Event()
        self._idle_probe_s = idle_probe_s
        self._last_probe = time.monotonic()

    def _new_producer(self) -> KafkaProducer:
        timeout_ms = int(self.send_timeout_s * 1000)
        return KafkaProducer(
            **self.settings.client_kwargs() | {"request_timeout_ms": min(self.settings.request_timeout_ms, timeout_ms)},
            acks="all",
            linger_ms=5,
            retries=3,
            max_block_ms=timeout_ms,
            delivery_timeout_ms=timeout_ms * 2,
            max_in_flight_requests_per_connection=5,
        )

    def _check_topics(self) -> None:
        check_topics(self.settings, self._topics, timeout_s=min(self.send_timeout_s, 5.0))

    def stop(self) -> None:
        self._stopping.set()
        self.outbox.wake_sender()

    def run(self) -> None:
        reader = self.outbox.reader()
        try:
            self._connect()  # says at start, not at the first send, when the link or its topics are wrong
            while not self._stopping.is_set():
                rows = reader.pending(self.batch)
                if not rows:
                    self._idle.set()
                    self._probe_when_due()
                    self.outbox.wait_for_messages(0.2)
                    continue
                self._idle.clear()
                if not self._send(rows, reader.acknowledge):
                    self._stopping.wait(self._backoff)
                    self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
                else:
                    self._backoff = MIN_BACKOFF_S
        finally:
            self._close_producer()
            reader.close()

    def drain(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.outbox.depth == 0:
                return True
            self.outbox.wake_sender()
            time.sleep(0.05)
        return self.outbox.depth == 0

    def _send(self, rows: list[OutboxRow], acknowledge: Callable[[list[int]], int]) -> bool:
        """Send a batch and delete what was acknowledged; False if the broker is away or a send failed."""
        if self._producer is None and not self._connect():
            return False
        futures = []
        try:
            for row in rows:
                futures.append(
                    (row.seq, self._producer.send(self.topic(row.kind), key=row.key.encode(), value=row.value))
                )
            self._producer.flush(timeout=self.send_timeout_s)
        except (KafkaError, OSError) as err:
            self._failed(f"{type(err).__name__}: {err}")
        acked = [seq for seq, future in futures if future.is_done and future.succeeded()]
        every = len(acked) == len(rows)
        if every:  # the link's state before the outbox shrinks: whoever sees it drained sees the broker reachable
            if self.broker_reachable is False:
                log.info("Kafka is reachable again: outbox draining", extra={"outbox_depth": self.outbox.depth})
            self.broker_reachable = True
            self.last_error = None
        if acked:
            acknowledge(acked)
            self.sent += len(acked)
            self.last_success = time.time()
        if every:
            return True
        failed = next((f.exception for _, f in futures if f.is_done and f.failed()), None)
        self._failed(f"{len(rows) - len(acked)} of {len(rows)} sends not acknowledged ({failed or 'timed out'})")
        return False

    def _connect(self) -> bool:
        """Make a producer once the broker accepts connections and has the topics; False (said once) if not."""
        try:
            check_reachable(self.settings.servers, timeout_s=1.0)
            if self._topics_check is not None:
                self._topics_check()
            self._producer = self._producer_factory()
        except TopicsMissing as err:
            self._topics_missing(err)
            return False
        except (BrokerUnreachable, KafkaError, OSError) as err:
            self._failed(f"{type(err).__name__}: {err}")
            return False
        self._reported_missing = None
        return True

    def _topics_missing(self, err: TopicsMissing) -> None:
        self.failures += 1
        if err.topics != self._reported_missing:
            log.error(
                "%s Keeping messages in the outbox and retrying.",
                err,
                extra={"outbox_depth": self.outbox.depth, "missing_topics": err.topics},
            )
            self._reported_missing = err.topics
        self.broker_reachable = False
        self.last_error = str(err)

    def _probe_when_due(self) -> None:
        """While idle, a broker that stopped accepting connections makes the link unreachable."""
        if self.broker_reachable is not True or time.monotonic() - self._last_probe < self._idle_probe_s:
            return
        self._last_probe = time.monotonic()
        try:
            check_reachable(self.settings.servers, timeout_s=1.0)
        except BrokerUnreachable as err:
            self._failed(f"idle probe: {err}")

    def _failed(self, reason: str) -> None:
        self.failures += 1
        if self.broker_reachable is not False or self._reported_missing is not None:
            self._reported_missing = None
            log.warning(
                "Kafka unreachable, keeping messages in the outbox: %s",
                reason,
                extra={"outbox_depth": self.outbox.depth, "bootstrap_servers": self.settings.bootstrap_servers},
            )
        self.broker_reachable = False
        self.last_error = reason
        self._close_producer()

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.close(timeout=0)  # abandon what it buffered: the outbox still has it
        except (KafkaError, OSError) as err:
            # kafka-python's close() flushes before it force-closes, so with records still buffered for a broker
            # that is gone it raises and leaves its I/O thread running (and raises again when garbage-collected).
            log.debug("closing the producer: %s; forcing it", err)
            sender = getattr(producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            producer._closed = True
