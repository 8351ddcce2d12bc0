"""Ingest: Kafka -> validate -> dead-letter -> drop duplicates -> prediction store, in event time.

One composite per topic does the same jobs for predictions, events, heartbeats and telemetry summaries:

    ReadKafka -> ParseMessages (bad records to the dead-letter topic, each with the reason)
              -> DropDuplicates (grouped by machine, one per (edge_id, seq)) -> WriteToStore (ON CONFLICT DO NOTHING)

Event time is the Beam timestamp: a prediction's or summary's window end, an event's own time. Valid messages travel
on as plain tuples (:mod:`pipelines.records`), not pydantic objects, so shuffles stay cheap, and in lists per machine
(:class:`ParseChunks`), each list stamped with the newest event time in it.
:class:`IngestPredictions` hands each machine's unique predictions on to :class:`pipelines.alerts.RaiseAlerts`.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from pydantic import ValidationError

from pipelines.consumed import CoverOffsets, ProduceCoveredDeadLetters, SkipConsumed
from pipelines.edge_trust import HeartbeatJudge, JudgedHeartbeatRecords
from pipelines.kafka_io import KafkaChunk, KafkaRecord, PartitionRange, ReadKafkaRanges
from pipelines.records import (
    FROM_BYTES,
    HEARTBEAT_IDENTITY,
    EventRecord,
    HeartbeatRecord,
    PredictionRecord,
    TelemetrySummaryRecord,
    event_record,
    prediction_record,
    risk_json,
    telemetry_summary_record,
    to_micros,
)
from pipelines.run_log import CONSUMER, WRITE_MS, ledger_stages
from precursor.contracts.messages import (
    ContractError,
    DeadLetter,
    EdgeEvent,
    EdgeMessage,
    Heartbeat,
    Prediction,
    TelemetrySummary,
    decode,
    event_detail,
    event_kind,
)
from precursor.contracts.settings import KafkaSettings
from precursor.store.db import StoreWriter
from precursor.store.ledger import Coverage, Spans

DEAD = "dead"
DROPPED = "dropped"  # positions (partition, offset) of the duplicates DropDuplicates dropped
NAMESPACE = "precursor"
UTC_MICROS = pa.timestamp("us", tz="UTC")
MACHINE = 2  # prediction and event records keep machine_id third
EDGE = 0


class RecordList(tuple):  # type: ignore[type-arg]
    """One key's record tuples as one element. Its coder pickles the list whole: the default coder takes every field
    of every record apart and back together at each shuffle (the runner's grouping does so twice), which cost more
    than parsing the record had."""

    __slots__ = ()


class RecordListCoder(beam.coders.Coder):
    def encode(self, value: RecordList) -> bytes:
        return pickle.dumps(tuple(value), pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> RecordList:
        return RecordList(pickle.loads(encoded))

    def estimate_size(self, value: RecordList) -> int:
        return 160 * len(value)  # about a prediction record's pickled size: the runner's estimate need not be exact

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return RecordList


beam.coders.registry.register_coder(RecordList, RecordListCoder)
KeyedRecords = tuple[str, RecordList]
"""``(machine_id, records)``, or ``(edge_id, records)`` for heartbeats."""


class ParseMessages(beam.DoFn):
    """Valid messages to the main output as record tuples stamped with their event time; anything else to ``dead``
    as a DeadLetter naming each bad field and its value."""

    def __init__(
        self,
        model: type[EdgeMessage],
        to_record: Callable[..., tuple[Any, ...]],
        event_time: int,
        counter_prefix: str = "",
    ) -> None:
        self._model = model
        self._to_record = to_record
        # Where a record can be read straight from its bytes into the same tuple (predictions), that is tried first.
        self._from_bytes = FROM_BYTES.get(to_record)
        self._event_time = event_time  # index of the record field that holds the event time (epoch microseconds)
        prefix = counter_prefix or model.__name__
        self._valid = Metrics.counter(NAMESPACE, f"{prefix}.valid")
        self._invalid = Metrics.counter(NAMESPACE, f"{prefix}.dead_lettered")

    def process(self, record: KafkaRecord) -> Iterator[Any]:
        row = self.read(record)
        if isinstance(row, DeadLetter):
            self._invalid.inc()
            yield beam.pvalue.TaggedOutput(DEAD, row)
            return
        self._valid.inc()
        yield TimestampedValue(row, Timestamp(micros=row[self._event_time]))

    def read(self, record: KafkaRecord) -> tuple[Any, ...] | DeadLetter:
        """The record as a record tuple, or the DeadLetter that says why it is not one."""
        if self._from_bytes is not None and record.value is not None:
            row = self._from_bytes(record.value, record.partition, record.offset)
            if row is not None:
                return row
        try:
            message = self._parse(record)
            return tuple(self._to_record(message, partition=record.partition, offset=record.offset))
        except ContractError as err:
            return dead_letter(record, str(err))
        except Exception as err:  # any record that cannot be read must not stop ingest at its offset
            return dead_letter(record, f"{self._model.__name__}: unreadable ({err!r})")

    def _parse(self, record: KafkaRecord) -> EdgeMessage:
        if record.value is None:
            raise ContractError(f"{self._model.__name__}: empty record (a tombstone has no message)")
        try:
            # pydantic's own JSON parser is the fast path; the slower decode() runs only to explain a failure.
            return self._model.model_validate_json(record.value)
        except ValidationError:
            return decode(self._model, record.value)


class ParseChunks(ParseMessages):
    """:class:`ParseMessages` over a fetch's list of records at once: valid records leave as ``(key, record tuples)``,
    one element per key (machine, or edge for heartbeats) and list, stamped with the newest event time among them;
    dead letters leave one by one, as there.

    Grouping by key before the shuffle makes the runner's per-element cost (encoding, the grouping itself) a cost per
    machine and fetch rather than per record; what is read, kept and dead-lettered is decided record by record, the
    same as :class:`ParseMessages` does it."""

    def __init__(
        self,
        model: type[EdgeMessage],
        to_record: Callable[..., tuple[Any, ...]],
        event_time: int,
        counter_prefix: str = "",
        key: int = MACHINE,
    ) -> None:
        super().__init__(model, to_record, event_time, counter_prefix)
        self._key = key

    def process(self, chunk: Iterable[KafkaRecord]) -> Iterator[Any]:  # type: ignore[override]
        by_key: dict[Any, list[tuple[Any, ...]]] = {}
        dead = 0
        from_bytes = self._from_bytes
        for record in chunk:
            # read() tries the fast reader first too; calling it here saves a call per record on the common path.
            row = from_bytes(record.value, record.partition, record.offset) if from_bytes and record.value else None
            if row is None:
                row = self.read(record)
            if isinstance(row, DeadLetter):
                dead += 1
                yield beam.pvalue.TaggedOutput(DEAD, row)
                continue
            by_key.setdefault(row[self._key], []).append(row)
        if dead:
            self._invalid.inc(dead)
        valid = sum(len(rows) for rows in by_key.values())
        if valid:
            self._valid.inc(valid)
        at = self._event_time
        for key, rows in by_key.items():
            yield TimestampedValue((key, RecordList(rows)), Timestamp(micros=max(r[at] for r in rows)))


def dead_letter(record: KafkaRecord, reason: str) -> DeadLetter:
    return DeadLetter.of(
        record.value,
        reason,
        source_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
    )


class SendDeadLetters(beam.PTransform):
    """DeadLetter messages to the dead-letter topic, keyed by the source record's key; with a store, their source
    offsets are then recorded as consumed by ``consumers`` (:class:`pipelines.consumed.ProduceCoveredDeadLetters`)."""

    def __init__(self, settings: KafkaSettings, store_path: str | None = None, consumers: Sequence[str] = ()) -> None:
        super().__init__()
        self._settings = settings
        self._store_path = store_path
        self._consumers = tuple(consumers)

    def expand(self, letters: beam.PCollection) -> beam.PCollection:
        return letters | "ProduceDeadLetters" >> beam.ParDo(
            ProduceCoveredDeadLetters(self._settings, self._store_path, self._consumers)
        )


class DropDuplicates(beam.PTransform):
    """Groups records by machine (by edge for heartbeats) and keeps one per (edge_id, seq): a retried send from an
    edge arrives twice but counts once. Takes ``(key, records)`` lists as :class:`ParseChunks` makes them and emits
    ``(key, unique records in arrival order)`` stamped at the newest event time among them.

    Grouping by machine (not by (edge_id, seq)) costs the same one shuffle and hands the alerting step each machine's
    records together, so the pipeline shuffles its predictions once.
    """

    def __init__(
        self,
        event_time: int,
        counter: str = "duplicates_dropped",
        identity: int = 2,
        arrival: int = -2,
        cover: CoverOffsets | None = None,
    ) -> None:
        """``identity``: how many leading fields make a record unique (2: edge_id and seq); ``arrival``: where the
        record's partition lies, its offset next (the last two fields unless a record says otherwise); ``cover``
        records the positions of the duplicates dropped as consumed (they become no row)."""
        super().__init__()
        self._arrival = arrival
        self._cover = cover
        self._event_time = event_time
        self._counter = counter
        self._identity = identity

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        duplicates = Metrics.counter(NAMESPACE, self._counter)
        event_time = self._event_time
        identity = self._identity
        arrival = self._arrival

        def keep_first(group: tuple[str, Iterable[tuple[tuple[Any, ...], ...]]]) -> Iterator[Any]:
            machine_id, lists = group
            seen: set[tuple[Any, ...]] = set()
            unique = []
            dropped = []
            records = [r for rows in lists for r in rows]
            for r in sorted(records, key=lambda r: (r[arrival], r[arrival + 1])):  # arrival: (partition, offset)
                if r[:identity] in seen:
                    dropped.append((r[arrival], r[arrival + 1]))
                    continue
                seen.add(r[:identity])
                unique.append(r)
            if dropped:
                duplicates.inc(len(dropped))
                yield beam.pvalue.TaggedOutput(DROPPED, tuple(dropped))
            newest = max(r[event_time] for r in unique)
            yield TimestampedValue((machine_id, RecordList(unique)), Timestamp(micros=newest))

        kept = (
            rows
            | "GroupByMachine" >> beam.GroupByKey().with_input_types(KeyedRecords)
            | "KeepFirst"
            >> beam.FlatMap(keep_first).with_output_types(KeyedRecords).with_outputs(DROPPED, main="unique")
        )
        if self._cover is not None:
            _ = kept[DROPPED] | "CoverDuplicates" >> beam.ParDo(self._cover)
        return kept["unique"]


_PREDICTION_FIELDS = len(PredictionRecord._fields)


def prediction_batch(rows: Sequence[tuple[Any, ...]], ingested_at: datetime) -> pa.Table:
    """Prediction record tuples as the store's ``predictions`` columns."""
    full = [r if len(r) == _PREDICTION_FIELDS else tuple(PredictionRecord(*r)) for r in rows]
    columns = PredictionRecord(*zip(*full, strict=True)) if full else PredictionRecord(*([()] * _PREDICTION_FIELDS))
    tops = [max(risk, key=itemgetter(1)) for risk in columns.risk]
    return pa.table(
        {
            "edge_id": pa.array(columns.edge_id, pa.string()),
            "seq": pa.array(columns.seq, pa.int64()),
            "machine_id": pa.array(columns.machine_id, pa.string()),
            "window_start": pa.array(columns.window_start_us, UTC_MICROS),
            "window_end": pa.array(columns.window_end_us, UTC_MICROS),
            "horizon_h": pa.array(columns.horizon_h, pa.float64()),
            "risk": pa.array([risk_json(risk) for risk in columns.risk], pa.string()),
            "max_risk": pa.array([top[1] for top in tops], pa.float64()),
            "top_kind": pa.array([top[0] for top in tops], pa.string()),
            "model_name": pa.array(columns.model_name, pa.string()),
            "model_version": pa.array(columns.model_version, pa.string()),
            "emitted_at": pa.array(columns.emitted_at_us, UTC_MICROS),
            "ingested_at": pa.array([to_micros(ingested_at)] * len(full), UTC_MICROS),
            "threshold": pa.array(columns.threshold, pa.float64()),
            "reasons": pa.array(columns.reasons, pa.string()),
        }
    )


def event_batch(rows: Sequence[tuple[Any, ...]], ingested_at: datetime) -> pa.Table:
    """Event record tuples as the store's ``events`` columns."""
    records = [EventRecord(*r) for r in rows]
    return pa.table(
        {
            "edge_id": [r.edge_id for r in records],
            "seq": pa.array([r.seq for r in records], pa.int64()),
            "machine_id": [r.machine_id for r in records],
            "ts": pa.array([r.at_us for r in records], UTC_MICROS),
            "event": [r.event for r in records],
            "kind": [event_kind(r.event) for r in records],
            "detail": pa.array([event_detail(r.event) for r in records], pa.string()),
            "ingested_at": pa.array([to_micros(ingested_at)] * len(records), UTC_MICROS),
        }
    )


def heartbeat_batch(rows: Sequence[tuple[Any, ...]], ingested_at: datetime) -> pa.Table:
    """Heartbeat record tuples as the store's ``heartbeats`` columns."""
    records = [HeartbeatRecord(*r) for r in rows]
    return pa.table(
        {
            "edge_id": [r.edge_id for r in records],
            "seq": pa.array([r.seq for r in records], pa.int64()),
            "ts": pa.array([r.at_us for r in records], UTC_MICROS),
            "model_name": [r.model_name for r in records],
            "model_version": [r.model_version for r in records],
            "model_sha256": pa.array([r.model_sha256 for r in records], pa.string()),
            "outbox_depth": pa.array([r.outbox_depth for r in records], pa.int64()),
            "lag_s": pa.array([r.lag_s for r in records], pa.float64()),
            "health": [r.health for r in records],
            "machines": pa.array([r.machines for r in records], pa.int64()),
            "ingested_at": pa.array([to_micros(ingested_at)] * len(records), UTC_MICROS),
            "trust": [r.trust for r in records],
            "trust_reason": pa.array([r.trust_reason for r in records], pa.string()),
            "model_known": pa.array([r.model_known for r in records], pa.bool_()),
            "agent_version": pa.array([r.agent_version for r in records], pa.string()),
            "agent_sha256": pa.array([r.agent_sha256 for r in records], pa.string()),
            "key_id": pa.array([r.key_id for r in records], pa.string()),
            "flow": pa.array([r.flow for r in records], pa.string()),
        }
    )


def telemetry_summary_batch(rows: Sequence[tuple[Any, ...]], ingested_at: datetime) -> pa.Table:
    """Telemetry summary record tuples as the store's ``telemetry_summaries`` columns: a row per sensor."""
    records = [TelemetrySummaryRecord(*r) for r in rows]
    each = [(r, sensor) for r in records for sensor in r.sensors]
    return pa.table(
        {
            "edge_id": pa.array([r.edge_id for r, _ in each], pa.string()),
            "seq": pa.array([r.seq for r, _ in each], pa.int64()),
            "machine_id": pa.array([r.machine_id for r, _ in each], pa.string()),
            "sensor": pa.array([s[0] for _, s in each], pa.string()),
            "window_start": pa.array([r.window_start_us for r, _ in each], UTC_MICROS),
            "window_end": pa.array([r.window_end_us for r, _ in each], UTC_MICROS),
            "value_mean": pa.array([s[1] for _, s in each], pa.float64()),
            "value_min": pa.array([s[2] for _, s in each], pa.float64()),
            "value_max": pa.array([s[3] for _, s in each], pa.float64()),
            "value_last": pa.array([s[4] for _, s in each], pa.float64()),
            "samples": pa.array([s[5] for _, s in each], pa.int64()),
            "readings": pa.array([r.readings for r, _ in each], pa.int64()),
            "ingested_at": pa.array([to_micros(ingested_at)] * len(each), UTC_MICROS),
        }
    )


class WriteToStore(beam.DoFn):
    """Batches a bundle's ``(key, records)`` into one insert; counts store rows that were new versus already
    stored.

    With a ``topic``, each insert also records the Kafka positions of its records (at ``arrival``: partition, then
    offset) as consumed by ``consumer``, in the rows' own transaction (:mod:`precursor.store.ledger`): a write that
    did not commit leaves neither, so the next run stores exactly what is missing. One store connection per writer
    for its life on PostgreSQL; on DuckDB the file is held only for each write (:class:`precursor.store.db.StoreWriter`
    says why)."""

    def __init__(
        self,
        store_path: str,
        table: str,
        to_batch: Callable[[Sequence[tuple[Any, ...]], datetime], pa.Table],
        counter_prefix: str,
        batch_size: int = 50_000,
        *,
        topic: str | None = None,
        consumer: str = CONSUMER,
        arrival: int = -2,
    ) -> None:
        self._store_path = store_path
        self._table = table
        self._to_batch = to_batch
        self._batch_size = batch_size
        self._topic = topic
        self._consumer = consumer
        self._arrival = arrival
        self._writer: StoreWriter | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._stored = Metrics.counter(NAMESPACE, f"{counter_prefix}.stored")
        self._already = Metrics.counter(NAMESPACE, f"{counter_prefix}.already_stored")
        self._write_ms = Metrics.distribution(NAMESPACE, WRITE_MS)

    def setup(self) -> None:
        self._writer = StoreWriter(self._store_path)

    def start_bundle(self) -> None:
        self._rows = []

    def process(self, group: tuple[Any, Sequence[tuple[Any, ...]]]) -> None:
        self._rows.extend(group[1])
        if len(self._rows) >= self._batch_size:
            self._flush()

    def finish_bundle(self) -> None:
        self._flush()

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._writer is None:  # a runner that skipped setup
            self.setup()
        assert self._writer is not None
        batch = self._to_batch(self._rows, datetime.now(UTC))
        arrival = self._arrival
        covers = (
            Coverage.of((self._consumer,), self._topic, ((r[arrival], r[arrival + 1]) for r in self._rows))
            if self._topic is not None
            else None
        )
        started = time.perf_counter()
        new = self._writer.insert_table(self._table, batch, covers=covers)
        self._write_ms.update(round(1000 * (time.perf_counter() - started)))
        self._stored.inc(new)
        self._already.inc(batch.num_rows - new)  # in store rows: a telemetry summary is a row per sensor
        self._rows = []


class _IngestTopic(beam.PTransform):
    """ReadKafka -> Parse -> (dead letters | DropDuplicates -> WriteToStore); returns each machine's unique records.

    Records travel in lists (a fetch's records per machine, then a run's per machine), never one element each: the
    local runner's cost per element was most of ingest's time when they did."""

    model: type[EdgeMessage]
    table: str
    to_record: Callable[..., tuple[Any, ...]]
    to_batch: Callable[[Sequence[tuple[Any, ...]], datetime], pa.Table]
    event_time: int
    key: int = MACHINE
    identity: int = 2
    arrival: int = -2  # where a record's partition lies, its offset next
    counter_prefix: str = ""
    alerted: bool = False  # whether a later stage decides on the records too (its own ledger: ledger_stages)

    def __init__(
        self,
        ranges: list[PartitionRange],
        settings: KafkaSettings,
        store_path: str,
        *,
        regroup: bool = False,
        consumer: str = CONSUMER,
        consumed: dict[int, Spans] | None = None,
    ) -> None:
        """``regroup``: reshuffle the records before the store writes them, for engines that would otherwise hand
        the writer one small bundle per machine (one transaction each). ``consumer``: whose ledger of consumed
        offsets the writes keep; ``consumed``: partition -> offsets within the ranges a run before this one has
        consumed already (skipped here)."""
        super().__init__()
        self._ranges = ranges
        self._settings = settings
        self._store_path = store_path
        self._regroup = regroup
        self._consumer = consumer
        self._consumed = {p: s for p, s in (consumed or {}).items() if s}
        self._topic = ranges[0].topic if ranges else None

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        chunks = pbegin | "ReadKafka" >> ReadKafkaRanges(self._settings, self._ranges, chunked=True)
        if self._consumed:
            chunks = chunks | "SkipConsumed" >> beam.ParDo(SkipConsumed(self._consumed)).with_output_types(KafkaChunk)
        stages = ledger_stages(self._consumer, self.alerted)
        topic = self._topic or ""
        parse = ParseChunks(self.model, self.to_record, self.event_time, self.counter_prefix, self.key)
        parsed = chunks | "ParseMessages" >> beam.ParDo(parse).with_output_types(KeyedRecords).with_outputs(
            DEAD, main="valid"
        )
        _ = parsed[DEAD] | "SendDeadLetters" >> SendDeadLetters(self._settings, self._store_path, stages)
        prefix = self.counter_prefix or self.model.__name__
        duplicates = f"{prefix}.duplicates_dropped" if self.counter_prefix else "duplicates_dropped"
        per_key = parsed["valid"] | "DropDuplicates" >> DropDuplicates(
            self.event_time, duplicates, self.identity, self.arrival, CoverOffsets(self._store_path, stages, topic)
        )
        records = per_key
        if self._regroup:
            records = records | "RegroupForWrite" >> beam.Reshuffle()
        writer = WriteToStore(
            self._store_path,
            self.table,
            self.to_batch,
            prefix,
            topic=self._topic,
            consumer=self._consumer,
            arrival=self.arrival,
        )
        _ = records | "WriteToStore" >> beam.ParDo(writer)
        return per_key


class IngestPredictions(_IngestTopic):
    """The predictions topic into the store; returns ``(machine_id, unique prediction records)``."""

    model = Prediction
    table = "predictions"
    to_record = staticmethod(prediction_record)
    to_batch = staticmethod(prediction_batch)
    event_time = PredictionRecord._fields.index("window_end_us")
    arrival = PredictionRecord._fields.index("partition")  # fields added later (threshold, reasons) come after it
    alerted = True  # RaiseAlerts decides on them: consumed once stored and decided


class IngestEvents(_IngestTopic):
    """The events topic into the store; returns ``(machine_id, unique event records)``."""

    model = EdgeEvent
    table = "events"
    to_record = staticmethod(event_record)
    to_batch = staticmethod(event_batch)
    event_time = EventRecord._fields.index("at_us")


class IngestHeartbeats(_IngestTopic):
    """The heartbeats topic into the store (the fleet page's edge health); returns ``(edge_id, unique records)``.
    Its counters are apart (``heartbeats.*``) so a run's prediction and event figures stay what they were.

    Each heartbeat is stored with the ``judge``'s verdict (:mod:`pipelines.edge_trust`): unsigned and forged ones are
    kept and flagged, never dropped. Without a judge no key is known, so any signed heartbeat reads as forged."""

    model = Heartbeat
    table = "heartbeats"
    to_batch = staticmethod(heartbeat_batch)
    event_time = HeartbeatRecord._fields.index("at_us")
    key = EDGE
    identity = HEARTBEAT_IDENTITY
    counter_prefix = "heartbeats"

    def __init__(
        self,
        ranges: list[PartitionRange],
        settings: KafkaSettings,
        store_path: str,
        *,
        regroup: bool = False,
        judge: HeartbeatJudge | None = None,
        consumer: str = CONSUMER,
        consumed: dict[int, Spans] | None = None,
    ) -> None:
        super().__init__(ranges, settings, store_path, regroup=regroup, consumer=consumer, consumed=consumed)
        self.to_record = JudgedHeartbeatRecords(judge or HeartbeatJudge(None, None))


class IngestTelemetrySummaries(_IngestTopic):
    """The telemetry topic (summaries from edges that opt in) into the store, a row per sensor; returns
    ``(machine_id, unique summary records)``. Its counters are apart (``telemetry.*``), so a run's prediction and
    event figures stay what they were."""

    model = TelemetrySummary
    table = "telemetry_summaries"
    to_record = staticmethod(telemetry_summary_record)
    to_batch = staticmethod(telemetry_summary_batch)
    event_time = TelemetrySummaryRecord._fields.index("window_end_us")
    counter_prefix = "telemetry"
