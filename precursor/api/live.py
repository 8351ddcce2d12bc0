"""The live tail: predictions and alerts from Kafka as server-sent events, resumable from any offset.

Each event's ``id`` is a **cursor**: for every partition of the tailed topics, the offset of the next record to send,
e.g. ``predictions@0:15,predictions@1:3,alerts@0:4``. A client that reconnects with that cursor (the ``from``
parameter, or the ``Last-Event-ID`` header that browsers' ``EventSource`` sends by itself) gets exactly the records it
has not seen yet. The first event of every stream is ``ready``, whose ``id`` is the starting cursor, so a client can
resume even if nothing arrived.

Records are read straight from Kafka (one assigned consumer per stream, no consumer group, nothing committed), never
from the store, so the tail holds no lock on the store and shows records as soon as the broker has them.

>>> c = Cursor.parse("predictions@1:3,predictions@0:15,alerts@0:4")
>>> c.encode()
'alerts@0:4,predictions@0:15,predictions@1:3'
>>> Cursor.parse("predictions@0:-1")
Traceback (most recent call last):
...
ValueError: cursor part 'predictions@0:-1' is not TOPIC@PARTITION:OFFSET with TOPIC one of alerts, predictions
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from kafka import KafkaConsumer, TopicPartition
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from infra.kafka_admin import check_reachable
from precursor.contracts.messages import Alert, ContractError, Message, Prediction, decode
from precursor.contracts.settings import KafkaSettings

log = logging.getLogger("precursor.api.live")

LiveTopic = Literal["predictions", "alerts"]
LIVE_TOPICS: tuple[LiveTopic, ...] = ("predictions", "alerts")
_MODELS: dict[str, type[Message]] = {"predictions": Prediction, "alerts": Alert}
_EVENT_NAMES = {"predictions": "prediction", "alerts": "alert"}
_PART = re.compile(r"^(?P<topic>[a-z]+)@(?P<partition>\d{1,6}):(?P<offset>\d{1,19})$")
MAX_CURSOR_CHARS = 8192


@dataclass(frozen=True)
class Cursor:
    """Where a stream stands: (topic, partition) -> the offset of the next record to send."""

    positions: dict[tuple[str, int], int] = field(default_factory=dict)

    def encode(self) -> str:
        return ",".join(f"{t}@{p}:{o}" for (t, p), o in sorted(self.positions.items()))

    @classmethod
    def parse(cls, text: str) -> Cursor:
        if len(text) > MAX_CURSOR_CHARS:
            raise ValueError(f"cursor is {len(text)} characters; at most {MAX_CURSOR_CHARS}")
        positions: dict[tuple[str, int], int] = {}
        for part in (p.strip() for p in text.split(",")):
            match = _PART.match(part)
            if not match or match["topic"] not in LIVE_TOPICS:
                raise ValueError(
                    f"cursor part {part[:80]!r} is not TOPIC@PARTITION:OFFSET with TOPIC one of "
                    + ", ".join(sorted(LIVE_TOPICS))
                )
            positions[(match["topic"], int(match["partition"]))] = int(match["offset"])
        return cls(positions)


StartAt = Literal["earliest", "latest"] | Cursor


def parse_start(text: str) -> StartAt:
    """``earliest``, ``latest`` or a cursor; a ValueError names what is wrong."""
    value = text.strip()
    if value in ("earliest", "latest"):
        return value  # type: ignore[return-value]
    try:
        return Cursor.parse(value)
    except ValueError as err:
        raise ValueError(f"from={text[:80]!r} is not 'earliest', 'latest' or a cursor ({err})") from None


@dataclass(frozen=True)
class LiveRecord:
    topic: str
    partition: int
    offset: int
    message: Message | None
    """None where the record does not match its contract (the pipeline dead-letters it; the tail skips it)."""


class KafkaTail:
    """One consumer over the tailed topics, assigned partition by partition and positioned from a start point.

    Partitions a cursor does not name start at their beginning, so a cursor from before a topic grew misses nothing.
    Offsets outside what the broker still holds are moved to the nearest one it has.
    """

    def __init__(
        self, settings: KafkaSettings, topics: Sequence[LiveTopic], start: StartAt, *, poll_ms: int = 200
    ) -> None:
        self._settings = settings
        self._topics = list(dict.fromkeys(topics))
        self._start = start
        self._poll_ms = poll_ms
        self._names = {getattr(settings.topics, t): t for t in self._topics}
        self._consumer: KafkaConsumer | None = None
        self._positions: dict[tuple[str, int], int] = {}

    def open(self) -> Cursor:
        """Connect, assign and seek; returns the starting cursor. Raises ConnectionError when no broker answers
        and LookupError for a missing topic."""
        check_reachable(self._settings.servers, timeout_s=2.0)
        consumer = KafkaConsumer(
            **self._settings.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=min(self._poll_ms, 500),
        )
        self._consumer = consumer
        partitions: list[TopicPartition] = []
        for name, topic in self._names.items():
            found = consumer.partitions_for_topic(name)
            if not found:
                raise LookupError(f"topic {name!r} ({topic}) does not exist on {self._settings.bootstrap_servers}")
            partitions += [TopicPartition(name, p) for p in sorted(found)]
        consumer.assign(partitions)
        earliest = consumer.beginning_offsets(partitions)
        latest = consumer.end_offsets(partitions)
        for tp in partitions:
            key = (self._names[tp.topic], tp.partition)
            if self._start == "earliest":
                offset = earliest[tp]
            elif self._start == "latest":
                offset = latest[tp]
            else:
                offset = self._start.positions.get(key, earliest[tp])
            offset = min(max(offset, earliest[tp]), latest[tp])
            consumer.seek(tp, offset)
            self._positions[key] = offset
        return self.cursor

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    @property
    def cursor(self) -> Cursor:
        return Cursor(dict(self._positions))

    def poll(self) -> list[LiveRecord]:
        """What arrived since the last poll (waits up to ``poll_ms``), in offset order per partition."""
        if self._consumer is None:
            raise RuntimeError("KafkaTail.poll before open")
        batches = self._consumer.poll(timeout_ms=self._poll_ms, max_records=500)
        out: list[LiveRecord] = []
        for tp, records in batches.items():
            topic = self._names[tp.topic]
            for record in records:
                message: Message | None
                try:
                    message = decode(_MODELS[topic], record.value) if record.value is not None else None
                except ContractError:
                    message = None
                out.append(LiveRecord(topic, tp.partition, record.offset, message))
        return out

    def advance(self, record: LiveRecord) -> Cursor:
        """The cursor just past ``record``: what a client resumes from once it has it."""
        self._positions[(record.topic, record.partition)] = record.offset + 1
        return self.cursor

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close(autocommit=False)


def sse(*, event: str | None = None, data: Any = None, id: str | None = None, comment: str | None = None) -> str:
    """One server-sent event (or a comment line, which clients ignore: a keepalive)."""
    lines = []
    if comment is not None:
        lines.append(f": {comment}")
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    if data is not None:
        lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def _payload(record: LiveRecord) -> dict[str, Any]:
    message = record.message
    assert message is not None
    payload: dict[str, Any] = {
        "partition": record.partition,
        "offset": record.offset,
        "message": message.model_dump(mode="json"),
    }
    if isinstance(message, Prediction):
        payload["max_risk"] = message.max_risk
        payload["top_kind"] = max(message.risk, key=lambda k: message.risk[k])
    return payload


def _machine_of(message: Message) -> str | None:
    return getattr(message, "machine_id", None)


async def live_events(
    tail: KafkaTail, start: Cursor, *, machine_id: str | None, limit: int | None, keepalive_s: float
) -> AsyncIterator[str]:
    """The stream of an opened tail: ``ready`` with the starting cursor, then one event per record, and keepalive
    comments (carrying the cursor) while it is quiet."""
    yield sse(event="ready", id=start.encode(), data={"cursor": start.encode(), "topics": tail.topics})
    sent = 0
    quiet_since = anyio.current_time()
    while limit is None or sent < limit:
        records = await anyio.to_thread.run_sync(tail.poll)
        for record in records:
            cursor = tail.advance(record)
            if record.message is None:
                continue
            if machine_id is not None and _machine_of(record.message) != machine_id:
                continue
            yield sse(event=_EVENT_NAMES[record.topic], id=cursor.encode(), data=_payload(record))
            sent += 1
            quiet_since = anyio.current_time()
            if limit is not None and sent >= limit:
                break
        if anyio.current_time() - quiet_since >= keepalive_s:
            yield sse(comment="keepalive", id=tail.cursor.encode())
            quiet_since = anyio.current_time()


class EventStreamResponse(Response):
    """A ``text/event-stream`` response that stops when the client goes away and always releases its consumer."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        # Not Response.__init__: that renders an empty body and declares Content-Length: 0 for it.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async with anyio.create_task_group() as tasks:

                async def pump() -> None:
                    try:
                        async for chunk in self._events:
                            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    except OSError:
                        log.debug("live tail client went away")
                    except Exception as err:  # the headers are sent: end the stream, saying why
                        log.warning("live tail stopped: %s", err)
                        with contextlib.suppress(OSError):
                            await send(
                                {
                                    "type": "http.response.body",
                                    "body": sse(event="error", data={"detail": str(err)}).encode(),
                                    "more_body": False,
                                }
                            )
                    tasks.cancel_scope.cancel()

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()

                tasks.start_soon(pump)
                tasks.start_soon(watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()  # type: ignore[attr-defined]
                await anyio.to_thread.run_sync(self._on_close)
