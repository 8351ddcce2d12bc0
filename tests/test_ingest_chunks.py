"""Ingest reads a fetch's records as one element: the chunked parser decides each record as the per-record one does,
and the coders that carry chunks and record lists between stages give back what they were given."""

from __future__ import annotations

from collections import defaultdict

from apache_beam import pvalue
from apache_beam.transforms.window import TimestampedValue

from pipelines.ingest import (
    DEAD,
    MACHINE,
    IngestPredictions,
    ParseChunks,
    ParseMessages,
    RecordList,
    RecordListCoder,
)
from pipelines.kafka_io import KafkaChunk, KafkaChunkCoder, KafkaRecord
from precursor.contracts.messages import Prediction, encode


def _prediction(seq: int, machine: str, hour: int) -> bytes:
    return encode(
        Prediction(
            edge_id="edge-c",
            seq=seq,
            machine_id=machine,
            window_start=f"2026-03-01T{hour:02d}:00:00Z",
            window_end=f"2026-03-01T{hour + 1:02d}:00:00Z",
            horizon_h=24,
            risk={"failure": 0.1 * (seq % 10), "bearing": 0.05},
            model_name="lm",
            model_version="1",
        )
    )


def _chunk() -> list[KafkaRecord]:
    values: list[bytes | None] = [
        _prediction(1, "pump-a", 3),
        _prediction(2, "pump-b", 1),
        b"\xff not json",
        _prediction(3, "pump-a", 1),  # older than pump-a's first: the list is stamped at its newest
        None,  # a tombstone
        _prediction(1, "pump-a", 3),  # a retried send: parsed here, dropped later by DropDuplicates
        _prediction(4, "pump-b", 5).replace(b'"failure":0.4', b'"failure":4'),  # out of range
    ]
    return [KafkaRecord("t.predictions", 2, 100 + i, b"k", v, 0) for i, v in enumerate(values)]


def _parsers() -> tuple[ParseMessages, ParseChunks]:
    c = IngestPredictions
    return (
        ParseMessages(c.model, c.to_record, c.event_time, c.counter_prefix),
        ParseChunks(c.model, c.to_record, c.event_time, c.counter_prefix, MACHINE),
    )


def test_a_chunk_is_decided_record_by_record_as_the_single_record_parser_does() -> None:
    single, chunked = _parsers()
    chunk = _chunk()
    expected_rows: dict[str, list[tuple]] = defaultdict(list)
    expected_dead = []
    for record in chunk:
        (out,) = list(single.process(record))
        if isinstance(out, pvalue.TaggedOutput):
            expected_dead.append(out.value)
        else:
            expected_rows[out.value[MACHINE]].append(out.value)

    outputs = list(chunked.process(KafkaChunk(chunk)))
    dead = [o.value for o in outputs if isinstance(o, pvalue.TaggedOutput)]
    assert all(o.tag == DEAD for o in outputs if isinstance(o, pvalue.TaggedOutput))
    same = [d.model_dump(exclude={"at"}) for d in dead] == [d.model_dump(exclude={"at"}) for d in expected_dead]
    assert same and len(dead) == 3  # the same letters, reasons and offsets, in order
    assert [d.offset for d in dead] == [102, 104, 106]

    valid = [o for o in outputs if isinstance(o, TimestampedValue)]
    assert len(valid) == 2  # one element per machine
    event_time = IngestPredictions.event_time
    for stamped in valid:
        machine, rows = stamped.value
        assert isinstance(rows, RecordList)
        assert list(rows) == expected_rows[machine]  # arrival order kept
        assert stamped.timestamp.micros == max(r[event_time] for r in rows)
    assert sum(len(o.value[1]) for o in valid) + len(dead) == len(chunk)  # every record once: nothing lost


def test_the_coders_give_back_what_they_were_given() -> None:
    chunk = KafkaChunk(_chunk())
    coder = KafkaChunkCoder()
    back = coder.decode(coder.encode(chunk))
    assert list(back) == list(chunk)
    assert coder.estimate_size(chunk) >= sum(len(r.value or b"") for r in chunk)

    _, chunked = _parsers()
    rows = next(o.value[1] for o in chunked.process(chunk) if isinstance(o, TimestampedValue))
    records = RecordListCoder()
    again = records.decode(records.encode(rows))
    assert isinstance(again, RecordList) and again == rows
