"""Reading Kafka from a Python Beam pipeline without the cross-language expansion service.

Beam's ``ReadFromKafka`` needs a Java expansion service (a Docker image by default). The local default must work with
no Docker, so this module reads a *bounded* snapshot instead: at planning time it fixes, per partition, the range
``[start, end)`` from the consumer's committed progress to the partition's current end, and the pipeline reads exactly
those records. Run it again (``--follow`` does so in a loop) and it picks up where the last successful run stopped.
Progress is committed only after the records it covers are stored, so a crash replays records rather than losing them,
and the store's primary key turns the replay into a no-op.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.partitioner.default import DefaultPartitioner, murmur2

from precursor.contracts.settings import KafkaSettings


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition: what one pipeline run reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


class KafkaRecord(NamedTuple):
    """One record as read. A NamedTuple: a run makes one per record, and a frozen dataclass took three times as long
    to build."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


class KafkaChunk:
    """A fetch's records of one partition, in offset order: what :class:`ReadPartitionChunks` emits."""

    __slots__ = ("records",)

    def __init__(self, records: list[KafkaRecord]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[KafkaRecord]:
        return iter(self.records)


class KafkaChunkCoder(beam.coders.Coder):
    """Encodes a chunk as one pickle of plain tuples, and estimates its size from the payloads alone: the runner
    estimates the size of the elements it hands on, and the default coder would pickle every record to do so."""

    def encode(self, chunk: KafkaChunk) -> bytes:
        return pickle.dumps([tuple(r) for r in chunk.records], pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> KafkaChunk:
        return KafkaChunk([KafkaRecord(*fields) for fields in pickle.loads(encoded)])

    def estimate_size(self, chunk: KafkaChunk) -> int:
        return sum(len(r.value or b"") + len(r.key or b"") + 32 for r in chunk.records)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return KafkaChunk


beam.coders.registry.register_coder(KafkaChunk, KafkaChunkCoder)


def _consumer(settings: KafkaSettings, **tuning: int) -> KafkaConsumer:
    return KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False, **tuning)


# A snapshot reader wants throughput, not latency: large fetches mean few round trips per partition.
_BULK_READ = {"max_partition_fetch_bytes": 16 * 1024 * 1024, "fetch_max_bytes": 64 * 1024 * 1024}


class TopicMissing(RuntimeError):
    """The cluster has no such topic."""


def plan_ranges(settings: KafkaSettings, topic: str, committed: Mapping[int, int]) -> list[PartitionRange]:
    """One range per partition from the committed offset (or the earliest retained one) to the current end."""
    consumer = _consumer(settings)
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise TopicMissing(f"topic {topic!r} does not exist on {settings.bootstrap_servers}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        earliest = consumer.beginning_offsets(tps)
        latest = consumer.end_offsets(tps)
    finally:
        consumer.close()
    ranges = []
    for tp in tps:
        # Retention may have deleted what we had not read yet: start at the earliest offset still there.
        start = max(committed.get(tp.partition, 0), earliest[tp])
        ranges.append(PartitionRange(topic, tp.partition, start, latest[tp]))
    return ranges


class ReadPartitionRange(beam.DoFn):
    """Reads the records of one :class:`PartitionRange`, in offset order."""

    def __init__(self, settings: KafkaSettings, stall_timeout_s: float = 60.0) -> None:
        self._settings = settings
        self._stall_timeout_s = stall_timeout_s
        self._consumer: KafkaConsumer | None = None

    def setup(self) -> None:
        self._consumer = _consumer(self._settings, **_BULK_READ)

    def process(self, r: PartitionRange) -> Iterator[KafkaRecord]:
        for chunk in self.chunks(r):
            yield from chunk

    def chunks(self, r: PartitionRange) -> Iterator[KafkaChunk]:
        """The range's records in offset order, a list per fetch."""
        assert self._consumer is not None
        if r.size == 0:
            return
        tp = TopicPartition(r.topic, r.partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, r.start)
        last_progress = time.monotonic()
        while self._consumer.position(tp) < r.end:
            batch = self._consumer.poll(timeout_ms=500, max_records=20_000).get(tp, [])
            if not batch:
                if time.monotonic() - last_progress > self._stall_timeout_s:
                    raise TimeoutError(
                        f"{r.topic}[{r.partition}]: no records for {self._stall_timeout_s:.0f} s at offset "
                        f"{self._consumer.position(tp)} of {r.end}"
                    )
                continue
            last_progress = time.monotonic()
            chunk = [
                KafkaRecord(rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.timestamp)
                for rec in batch
                if rec.offset < r.end
            ]
            if chunk:
                yield KafkaChunk(chunk)
            if len(chunk) < len(batch):
                return

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


class ReadPartitionChunks(ReadPartitionRange):
    """Reads one :class:`PartitionRange` as lists of records (one per fetch, in offset order): a stage that handles
    records in bulk then pays the runner's cost per element once per list, not once per record."""

    def process(self, r: PartitionRange) -> Iterator[KafkaChunk]:  # type: ignore[override]
        yield from self.chunks(r)


class ReadKafkaRanges(beam.PTransform):
    """``PBegin -> PCollection[KafkaRecord]`` for a fixed set of partition ranges; with ``chunked``,
    ``PCollection[KafkaChunk]`` (see :class:`ReadPartitionChunks`)."""

    def __init__(self, settings: KafkaSettings, ranges: list[PartitionRange], *, chunked: bool = False) -> None:
        super().__init__()
        self._settings = settings
        self._ranges = [r for r in ranges if r.size > 0]
        self._chunked = chunked
        self._reader = ReadPartitionChunks if chunked else ReadPartitionRange

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        # Create would add a reshuffle of its own for more than one range: the one below, where it helps, is enough.
        ranges = pbegin | "PlanPartitions" >> beam.Create(self._ranges, reshuffle=False)
        if not isinstance(pbegin.pipeline.runner, FnApiRunner):
            # Each range is read by one worker; a reshuffle spreads partitions over workers on a distributed runner.
            # The in-process runner has one worker, and building and running the reshuffle's five steps cost more
            # than the reading they would spread.
            ranges = ranges | "SpreadPartitions" >> beam.Reshuffle()
        return ranges | "ReadPartitions" >> beam.ParDo(self._reader(self._settings)).with_output_types(
            KafkaChunk if self._chunked else KafkaRecord
        )


class KeyHashCache(DefaultPartitioner):
    """kafka-python's default partitioner (murmur2 of the key, as the Java client), remembering each key's hash: the
    hash is a Python loop over the key's bytes, and a run sends many records under the same few keys (machines)."""

    def __init__(self, limit: int = 65_536) -> None:
        self._hashes: dict[bytes, int] = {}
        self._limit = limit

    def partition(
        self, topic: str, key: object, serialized_key: bytes | None, value: object, serialized: object, cluster: Any
    ) -> int:
        if serialized_key is None:
            return super().partition(topic, key, serialized_key, value, serialized, cluster)
        if topic not in cluster.topics():
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        h = self._hashes.get(serialized_key)
        if h is None:
            if len(self._hashes) >= self._limit:
                self._hashes.clear()
            h = self._hashes[serialized_key] = murmur2(serialized_key) & 0x7FFFFFFF
        partitions = sorted(cluster.partitions_for_topic(topic))
        return partitions[h % len(partitions)]


class ProduceToKafka(beam.DoFn):
    """Sends ``(key, value)`` byte pairs to one topic with ``acks=all``; a bundle ends only when all were acknowledged,
    so a failed send fails the run instead of being lost."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self._settings = settings
        self._topic = topic
        self._producer: KafkaProducer | None = None
        self._pending: list = []

    def setup(self) -> None:
        # A bundle's sends are flushed at its end anyway, so they may wait for one another: batches of up to 1 MiB
        # leave every 100 ms instead of every 5 ms with a record or two (each new batch woke the sender thread,
        # ~20,000 times for 35,000 alerts); 100 ms bounds what a long streaming bundle adds to an alert's delivery.
        self._producer = KafkaProducer(
            **self._settings.client_kwargs(),
            acks="all",
            linger_ms=100,
            batch_size=1024 * 1024,
            partitioner=KeyHashCache(),
        )

    def start_bundle(self) -> None:
        self._pending = []

    def process(self, element: tuple[bytes | None, bytes]) -> None:
        assert self._producer is not None
        key, value = element
        self._pending.append(self._producer.send(self._topic, key=key, value=value))

    def finish_bundle(self) -> None:
        assert self._producer is not None
        self._producer.flush()
        for future in self._pending:
            future.get(timeout=30)
        self._pending = []

    def teardown(self) -> None:
        if self._producer is not None:
            self._producer.close()
