"""The ingest stages that account for Kafka records in the store's ledger of consumed offsets
(:mod:`precursor.store.ledger`) besides the store writers themselves.

Every record a run reads ends as exactly one of: rows (the store writer records its offset in the rows' transaction),
an alert decision (the alert writer, for predictions), a dead letter, or a duplicate of a record kept in the same run.
The last two become no row, so these stages record them on their own:

- :class:`ProduceCoveredDeadLetters` sends dead letters to the dead-letter topic and, once Kafka acknowledged them,
  records their source offsets. The dead-letter topic is outside the store's transaction: a kill between the
  acknowledgement and the ledger write sends that dead letter again on the next run (at least once there; each
  carries its source topic, partition and offset, so a reader can tell the repeats).
- :class:`CoverOffsets` records the offsets of dropped duplicates. Their twin (the record kept) is recorded only with
  its own rows, so a kill that loses the twin's write re-reads the twin, never the other way round.

:class:`SkipConsumed` drops, from what a run reads, the records that the ledger says are consumed already: after a
kill, the next run reads from the end of the contiguous consumed prefix and stores or decides only what no committed
write had covered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipelines.kafka_io import KafkaChunk, ProduceToKafka
from precursor.contracts.messages import DeadLetter, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store.db import StoreWriter
from precursor.store.ledger import Coverage, Spans, contains

NAMESPACE = "precursor"
SKIPPED = "consumed_skipped"
"""Records a run read but skipped: a run before it that did not finish had stored (and decided) them already."""


class CoverOffsets(beam.DoFn):
    """``(partition, offset)`` pairs, or lists of them, of records that became no row -> consumed in the ledger of
    each of ``consumers``, one transaction per bundle."""

    def __init__(self, store_path: str, consumers: Sequence[str], topic: str) -> None:
        self._store_path = store_path
        self._consumers = tuple(consumers)
        self._topic = topic
        self._positions: list[tuple[int, int]] = []
        self._writer: StoreWriter | None = None

    def setup(self) -> None:
        self._writer = StoreWriter(self._store_path)

    def start_bundle(self) -> None:
        self._positions = []

    def process(self, positions: tuple[int, int] | Sequence[tuple[int, int]]) -> None:
        if positions and isinstance(positions[0], int):
            self._positions.append(positions)  # type: ignore[arg-type]
        else:
            self._positions.extend(positions)  # type: ignore[arg-type]

    def finish_bundle(self) -> None:
        assert self._writer is not None
        if self._positions:
            self._writer.cover(Coverage.of(self._consumers, self._topic, self._positions))
        self._positions = []

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()


class ProduceCoveredDeadLetters(ProduceToKafka):
    """DeadLetter messages to the dead-letter topic (keyed by the source record's key), then, once Kafka acknowledged
    them all, their source offsets consumed in the ledger (see the module's note on replays)."""

    def __init__(self, settings: KafkaSettings, store_path: str | None = None, consumers: Sequence[str] = ()) -> None:
        super().__init__(settings, settings.topics.deadletter)
        self._store_path = store_path
        self._consumers = tuple(consumers)
        self._sources: list[tuple[str, int, int]] = []
        self._writer: StoreWriter | None = None

    def setup(self) -> None:
        super().setup()
        if self._store_path is not None and self._consumers:
            self._writer = StoreWriter(self._store_path)

    def start_bundle(self) -> None:
        super().start_bundle()
        self._sources = []

    def process(self, letter: DeadLetter) -> None:  # type: ignore[override]
        super().process(((letter.key or "").encode(), encode(letter)))
        if letter.source_topic is not None and letter.partition is not None and letter.offset is not None:
            self._sources.append((letter.source_topic, letter.partition, letter.offset))

    def finish_bundle(self) -> None:
        super().finish_bundle()  # every dead letter acknowledged first: only then is its source consumed
        if self._writer is not None and self._sources:
            for topic in sorted({t for t, _, _ in self._sources}):
                positions = [(p, o) for t, p, o in self._sources if t == topic]
                self._writer.cover(Coverage.of(self._consumers, topic, positions))
        self._sources = []

    def teardown(self) -> None:
        super().teardown()
        if self._writer is not None:
            self._writer.close()


class SkipConsumed(beam.DoFn):
    """Kafka chunks without the records already consumed (``consumed``: partition -> spans, as
    :meth:`precursor.store.PredictionStore.consumed` reads them at planning time)."""

    def __init__(self, consumed: Mapping[int, Spans]) -> None:
        self._consumed = {int(p): list(s) for p, s in consumed.items() if s}
        self._skipped = Metrics.counter(NAMESPACE, SKIPPED)

    def process(self, chunk: KafkaChunk) -> Iterator[KafkaChunk]:
        kept = [r for r in chunk if not contains(self._consumed.get(r.partition, []), r.offset)]
        if len(kept) < len(chunk):
            self._skipped.inc(len(chunk) - len(kept))
        if kept:
            yield KafkaChunk(kept)
