"""The spine against real parts: edge agent -> Kafka broker -> Beam pipeline (FnApiRunner) -> DuckDB store."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeConfig
from edge_agent.publisher import KafkaPublisher
from edge_agent.scorers import load_scorer
from edge_agent.sources import FileReplay
from pipelines.run import run_once
from precursor.contracts.messages import DeadLetter, Prediction, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect

pytestmark = pytest.mark.integration


def write_telemetry(path: Path, machines: int, minutes: int) -> None:
    rows = ["timestamp,machine_id,temp,vib,pressure"]
    for m in range(machines):
        for t in range(0, minutes, 2):
            ts = f"2026-03-01T{t // 60:02d}:{t % 60:02d}:00Z"
            rows.append(f"{ts},pump-{m:02d},{40 + m + t / 30:.2f},{0.1 * (t % 7):.2f},{3 + (m % 3) / 10:.2f}")
    path.write_text("\n".join(rows) + "\n")


def run_edge(tmp_path: Path, settings: KafkaSettings, edge_id: str = "edge-it") -> int:
    write_telemetry(tmp_path / "telemetry.csv", machines=12, minutes=240)
    config = EdgeConfig.from_dict(
        {
            "edge_id": edge_id,
            "sources": [{"type": "replay", "telemetry": "telemetry.csv"}],
            "window": {"length": "30m", "every": "10m", "min_points": 3},
            "state_dir": "state",
        },
        base=tmp_path,
    )
    publisher = KafkaPublisher(settings)
    try:
        stats = EdgeAgent(config, load_scorer(config.model), publisher).run(FileReplay(config.sources[0]))
    finally:
        publisher.close()
    return stats.predictions


def stored(store: Path) -> list[tuple[str, int]]:
    with connect(store, read_only=True) as con:
        return con.execute("SELECT edge_id, seq FROM predictions ORDER BY seq").fetchall()


def test_every_window_is_stored_exactly_once_also_when_the_pipeline_runs_twice(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    n = run_edge(tmp_path, kafka_settings)
    assert n == 12 * 23  # windows end every 10 minutes from 00:10 to 03:50 for each of 12 machines
    store = tmp_path / "store.duckdb"

    first = run_once(kafka_settings, store)
    assert (first.read, first.stored, first.dead_lettered) == (n, n, 0)
    rows = stored(store)
    assert len(rows) == n and len(set(rows)) == n

    # Nothing new since the committed offsets: nothing read.
    assert run_once(kafka_settings, store).read == 0
    # Forced over the same offsets again: every record is seen, none is stored twice.
    again = run_once(kafka_settings, store, from_beginning=True)
    assert (again.read, again.stored, again.already_stored) == (n, 0, n)
    assert len(stored(store)) == n


def test_a_retried_send_is_dropped_as_a_duplicate(tmp_path: Path, kafka_settings: KafkaSettings) -> None:
    p = Prediction(
        edge_id="edge-retry",
        seq=41,
        machine_id="pump-1",
        window_start="2026-03-01T00:00:00Z",
        window_end="2026-03-01T00:30:00Z",
        horizon_h=24,
        risk={"failure": 0.9},
        model_name="drift-zscore",
        model_version="1",
    )
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    for _ in range(3):  # the same message, sent three times as a flaky link would
        producer.send(kafka_settings.topics.predictions, key=b"pump-1", value=encode(p))
    producer.flush()
    producer.close()

    report = run_once(kafka_settings, tmp_path / "store.duckdb")
    assert (report.read, report.stored, report.duplicates) == (3, 1, 2)


def test_malformed_records_go_to_the_dead_letter_topic_with_a_reason_and_good_ones_still_land(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    good = Prediction(
        edge_id="edge-dl",
        seq=1,
        machine_id="fan-9",
        window_start="2026-03-01T00:00:00Z",
        window_end="2026-03-01T00:30:00Z",
        horizon_h=12,
        risk={"failure": 0.2},
        model_name="drift-zscore",
        model_version="1",
    )
    wrong_type = json.loads(encode(good)) | {"seq": "not-a-number"}
    out_of_range = json.loads(encode(good)) | {"seq": 2, "risk": {"failure": 3.5}}
    bad = [b"\x00\x01 not json", json.dumps(wrong_type).encode(), json.dumps(out_of_range).encode(), b"[]"]
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    for value in [bad[0], bad[1], encode(good), bad[2], bad[3]]:
        producer.send(kafka_settings.topics.predictions, key=b"fan-9", value=value)
    producer.flush()
    producer.close()

    report = run_once(kafka_settings, tmp_path / "store.duckdb")
    assert (report.read, report.stored, report.dead_lettered) == (5, 1, 4)

    consumer = KafkaConsumer(
        kafka_settings.topics.deadletter,
        **kafka_settings.client_kwargs(),
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    letters = []
    for record in consumer:
        letters.append(decode(DeadLetter, record.value))
        if len(letters) == 4:
            break
    consumer.close()
    assert sorted(base64.b64decode(d.raw_b64) for d in letters) == sorted(bad)
    reasons = {base64.b64decode(d.raw_b64): d.reason for d in letters}
    assert "not valid JSON" in reasons[bad[0]]
    assert "seq='not-a-number'" in reasons[bad[1]]
    assert "risk.failure=3.5" in reasons[bad[2]]
    assert "expected a JSON object, got list" in reasons[bad[3]]
    assert all(d.source_topic == kafka_settings.topics.predictions and d.offset is not None for d in letters)
