"""Ingest beyond predictions: heartbeats and events through the real broker, duplicates and bad records included."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipelines.run import run_once
from precursor.contracts.messages import DeadLetter, EdgeEvent, Heartbeat, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect

pytestmark = pytest.mark.integration


def test_heartbeats_and_events_are_stored_once_and_bad_ones_dead_lettered_with_the_field_named(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    beat = Heartbeat(edge_id="edge-7", seq=3, timestamp="2026-03-01T00:05:00Z", model_name="lm", model_version="2",
                     outbox_depth=12, lag_s=1.5, health="degraded", machines=4)  # fmt: skip
    later = beat.model_copy(update={"seq": 4, "health": "ok", "outbox_depth": 0})
    event = EdgeEvent(edge_id="edge-7", seq=5, machine_id="pump-1", timestamp="2026-03-01T00:04:00Z",
                      event="error:E42")  # fmt: skip
    bad_event = encode(event).replace(b'"error:E42"', b'"exploded"')
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    for value in (encode(beat), encode(beat), encode(later)):  # the first one retried
        producer.send(kafka_settings.topics.heartbeats, key=b"edge-7", value=value)
    for value in (encode(event), bad_event):
        producer.send(kafka_settings.topics.events, key=b"pump-1", value=value)
    producer.flush()
    producer.close()

    report = run_once(kafka_settings, tmp_path / "store.duckdb")

    assert (report.heartbeats_read, report.heartbeats_stored) == (3, 2)
    assert (report.read, report.stored, report.dead_lettered) == (2, 1, 1)
    with connect(tmp_path / "store.duckdb", read_only=True) as con:
        beats = con.execute("SELECT seq, health, outbox_depth, lag_s FROM heartbeats ORDER BY seq").fetchall()
        events = con.execute("SELECT machine_id, kind, detail FROM events").fetchall()
    assert beats == [(3, "degraded", 12, 1.5), (4, "ok", 0, 1.5)]
    assert events == [("pump-1", "error", "E42")]
    consumer = KafkaConsumer(
        kafka_settings.topics.deadletter, **kafka_settings.client_kwargs(), auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )  # fmt: skip
    letter = decode(DeadLetter, next(iter(consumer)).value)
    consumer.close()
    assert base64.b64decode(letter.raw_b64) == bad_event
    assert letter.source_topic == kafka_settings.topics.events and "event='exploded'" in letter.reason
    assert run_once(kafka_settings, tmp_path / "store.duckdb").heartbeats_read == 0  # offsets were committed
