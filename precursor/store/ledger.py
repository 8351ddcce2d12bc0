"""Which Kafka records a consumer has consumed, kept in the store by the transaction that stores what they became.

A run's writers (the store writer, the alert writer, and the stages that account for records that become no row:
dead letters and dropped duplicates) each record, with what they write, the offsets they have finished with: a row of
``consumed_ranges`` per write, consumer and partition, its offsets as sorted ``[start, end)`` spans. So the rows a
write stores and the positions they cover commit together or not at all, on either backend and whatever bundles the
runner cuts: a run killed at any point leaves exactly the writes that committed, each with its offsets.

The next run reads from the end of the contiguous consumed prefix (``consumer_offsets.next_offset`` extended by the
ledger) and skips the offsets above it that are consumed already, so nothing is stored or decided twice and nothing
is re-read forever. After a run that finished, its ranges are folded into ``consumer_offsets`` and their ledger rows
deleted (:func:`pipelines.run.run_once`), so the ledger holds only what runs that did not finish left behind.

A record a stage must see is consumed only when every stage has finished with it: predictions are stored *and*
decided by the alert rule, so their ledger is kept per stage (``ingest-v0`` and ``ingest-v0/alerts``) and the
consumed offsets are the intersection.

>>> spans_of([7, 3, 4, 5, 9])
[(3, 6), (7, 8), (9, 10)]
>>> intersect([(0, 10)], union([(2, 4)], [(3, 6), (8, 12)]))
[(2, 6), (8, 10)]
>>> prefix_end([(0, 5), (5, 8), (9, 10)], 0), prefix_end([(2, 3)], 0), prefix_end([(2, 3)], 2)
(8, 0, 3)
>>> decode(encode([(3, 6), (9, 10)]))
[(3, 6), (9, 10)]
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

Spans = list[tuple[int, int]]
"""Sorted, disjoint, non-adjacent ``[start, end)`` offset spans of one partition."""

LEDGER_TABLE = """
-- Offsets a consumer (or one stage of it: 'ingest-v0/alerts') finished with, written in the transaction that stored
-- what they became (precursor.store.ledger); folded into consumer_offsets when a run finishes.
CREATE TABLE IF NOT EXISTS consumed_ranges (
    consumer     VARCHAR NOT NULL,
    topic        VARCHAR NOT NULL,
    partition    INTEGER NOT NULL,
    first_offset BIGINT  NOT NULL,
    end_offset   BIGINT  NOT NULL,
    spans        VARCHAR NOT NULL,
    records      BIGINT  NOT NULL,
    written_at   TIMESTAMPTZ NOT NULL
);
"""

LEDGER_COLUMNS = ("consumer", "topic", "partition", "first_offset", "end_offset", "spans", "records", "written_at")
LEDGER_INSERT = f"INSERT INTO consumed_ranges ({', '.join(LEDGER_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def spans_of(offsets: Iterable[int]) -> Spans:
    """The offsets as maximal runs of consecutive ones."""
    spans: Spans = []
    for offset in sorted(set(offsets)):
        if spans and spans[-1][1] == offset:
            spans[-1] = (spans[-1][0], offset + 1)
        else:
            spans.append((offset, offset + 1))
    return spans


def union(*many: Iterable[tuple[int, int]]) -> Spans:
    """Every offset in any of the spans, merged (overlapping and touching spans become one)."""
    merged: Spans = []
    for start, end in sorted(s for spans in many for s in spans):
        if start >= end:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> Spans:
    """The offsets in both (each argument sorted and disjoint, as :func:`union` leaves them)."""
    out: Spans = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return union(out)


def prefix_end(spans: Sequence[tuple[int, int]], start: int) -> int:
    """How far the offsets from ``start`` on are consumed without a gap."""
    for first, end in spans:
        if first > start:
            break
        start = max(start, end)
    return start


def contains(spans: Sequence[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` lies in one of the sorted spans."""
    i = bisect_right(spans, (offset, float("inf"))) - 1
    return i >= 0 and spans[i][0] <= offset < spans[i][1]


def count(spans: Iterable[tuple[int, int]], start: int = 0, end: int | None = None) -> int:
    """How many offsets the spans hold within ``[start, end)``."""
    return sum(max(0, min(e, end if end is not None else e) - max(s, start)) for s, e in spans)


def encode(spans: Sequence[tuple[int, int]]) -> str:
    """``"3-6,9-10"``: compact, and the same text on both backends."""
    return ",".join(f"{s}-{e}" for s, e in spans)


def decode(text: str) -> Spans:
    return [(int(s), int(e)) for s, e in (part.split("-") for part in text.split(",") if part)]


@dataclass(frozen=True)
class Coverage:
    """What one write finished with: per partition of ``topic``, the offsets, for each of ``consumers``."""

    consumers: tuple[str, ...]
    topic: str
    spans: Mapping[int, Spans]

    @classmethod
    def of(cls, consumers: Sequence[str], topic: str, positions: Iterable[tuple[int, int]]) -> Coverage:
        """From ``(partition, offset)`` pairs, in any order, repeats allowed."""
        by_partition: dict[int, list[int]] = {}
        for partition, offset in positions:
            by_partition.setdefault(int(partition), []).append(int(offset))
        return cls(tuple(consumers), topic, {p: spans_of(o) for p, o in sorted(by_partition.items())})

    def __bool__(self) -> bool:
        return bool(self.consumers) and any(self.spans.values())

    def rows(self, now: datetime) -> list[tuple[Any, ...]]:
        """The ledger rows (:data:`LEDGER_INSERT`'s parameters): one per consumer and partition."""
        return [
            (consumer, self.topic, partition, spans[0][0], spans[-1][1], encode(spans), count(spans), now)
            for consumer in self.consumers
            for partition, spans in self.spans.items()
            if spans
        ]


def consumed(next_offsets: Mapping[int, int], ledgers: Sequence[Iterable[tuple[int, str]]]) -> dict[int, Spans]:
    """partition -> offsets every stage has consumed: below the committed next offset, or in each stage's ledger
    rows (``(partition, spans text)``, one iterable per stage)."""
    per_stage: list[dict[int, Spans]] = []
    for rows in ledgers:
        by_partition: dict[int, list[Spans]] = {}
        for partition, text in rows:
            by_partition.setdefault(int(partition), []).append(decode(text))
        per_stage.append({p: union(*s) for p, s in by_partition.items()})
    partitions = set(next_offsets).union(*per_stage)
    out: dict[int, Spans] = {}
    for p in sorted(partitions):
        below = [(0, next_offsets[p])] if next_offsets.get(p, 0) > 0 else []
        done: Spans | None = None
        for stage in per_stage:
            spans = union(below, stage.get(p, []))
            done = spans if done is None else intersect(done, spans)
        done = done if done is not None else union(below)
        if done:
            out[p] = done
    return out
