"""The live tail against the real broker: events arrive, and a client resumes exactly where its cursor says."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from kafka import KafkaProducer

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.messages import Alert, Prediction, encode
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import AUTH, TOKEN, serving
from tests.fixtures_messages import hourly_prediction

pytestmark = pytest.mark.integration


def prediction(seq: int, machine_id: str, risk: float) -> Prediction:
    return hourly_prediction(
        seq,
        edge_id="edge-live",
        seq=seq,
        machine_id=machine_id,
        risk={"bearing": risk},
        model_name="precursor-lm",
        model_version="0.3.0",
    )


def send(settings: KafkaSettings, topic: str, items: list[tuple[str, bytes]]) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all")
    for key, value in items:
        producer.send(topic, key=key.encode(), value=value)
    producer.flush()
    producer.close()


def parse_sse(text: str) -> list[dict]:
    events = []
    for block in text.split("\n\n"):
        event: dict = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            event[name] = value.strip()
        if "event" in event:
            event["data"] = json.loads(event["data"]) if "data" in event else None
            events.append(event)
    return events


@pytest.fixture
def app(kafka_settings: KafkaSettings, tmp_path: Path):  # type: ignore[no-untyped-def]
    return create_app(ApiSettings(tokens=TOKEN, store=tmp_path / "unused.duckdb", live_poll_ms=100), kafka_settings)


def test_the_tail_resumes_exactly_after_the_cursor(app, kafka_settings: KafkaSettings) -> None:  # type: ignore[no-untyped-def]
    predictions = [prediction(i, f"m-{i % 4:03d}", 0.1 * (i % 10)) for i in range(1, 13)]
    send(kafka_settings, kafka_settings.topics.predictions, [(p.machine_id, encode(p)) for p in predictions])
    send(kafka_settings, kafka_settings.topics.predictions, [("m-000", b"this is not a prediction")])
    alert = Alert(
        machine_id="m-001",
        state="raised",
        kind="bearing",
        risk=0.9,
        at=datetime(2026, 3, 1, tzinfo=UTC),
        model_version="0.3.0",
    )
    send(kafka_settings, kafka_settings.topics.alerts, [("m-001", encode(alert))])
    everything = {("prediction", p.seq) for p in predictions} | {("alert", None)}

    def key(event: dict) -> tuple[str, int | None]:
        return event["event"], event["data"]["message"].get("seq")

    with TestClient(app) as client:
        first = client.get("/api/v1/live", params={"from": "earliest", "limit": 5}, headers=AUTH)
        assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
        head = parse_sse(first.text)
        assert head[0]["event"] == "ready"
        got = head[1:]
        assert len(got) == 5
        cursor = got[-1]["id"]
        rest = parse_sse(
            client.get("/api/v1/live", params={"from": cursor, "limit": len(everything) - 5}, headers=AUTH).text
        )[1:]
        again = parse_sse(
            client.get(
                "/api/v1/live", params={"limit": len(everything) - 5}, headers=AUTH | {"Last-Event-ID": cursor}
            ).text
        )[1:]
        only = parse_sse(
            client.get(
                "/api/v1/live", params={"from": "earliest", "limit": 3, "machine_id": "m-002"}, headers=AUTH
            ).text
        )[1:]
    keys = [key(e) for e in got + rest]
    assert len(keys) == len(set(keys)) and set(keys) == everything  # each once, none lost, the bad record skipped
    assert [key(e) for e in again] == [key(e) for e in rest]  # Last-Event-ID resumes the same way
    assert {e["data"]["message"]["machine_id"] for e in only} == {"m-002"} and len(only) == 3
    # Each event's cursor is the ready cursor moved past exactly the records seen so far.
    ready = dict(part.split(":") for part in head[0]["id"].split(","))
    assert all(int(v) == 0 for v in ready.values())


def test_a_new_prediction_reaches_a_listening_client_within_a_second(app, kafka_settings: KafkaSettings) -> None:  # type: ignore[no-untyped-def]
    fresh = prediction(99, "m-042", 0.87)
    delays: list[float] = []
    with serving(app) as base, httpx.Client(base_url=base, timeout=20) as http:
        with http.stream("GET", "/api/v1/live", params={"topic": "predictions"}, headers=AUTH) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("id: ")  # the ready event: the tail is positioned at the end now
            sent_at = time.monotonic()
            threading.Thread(
                target=send, args=(kafka_settings, kafka_settings.topics.predictions, [("m-042", encode(fresh))])
            ).start()
            event: dict[str, str] = {}
            for line in lines:
                if line.startswith("data: ") and event.get("event") == "prediction":
                    delays.append(time.monotonic() - sent_at)
                    payload = json.loads(line[6:])
                    break
                if line.startswith("event: "):
                    event["event"] = line[7:]
        assert payload["message"]["seq"] == 99 and payload["max_risk"] == pytest.approx(0.87)
        assert payload["top_kind"] == "bearing"
        # Closing the stream releases the server's consumer; the server goes on serving.
        assert http.get("/api/v1/health").status_code == 200
    assert delays[0] < 5.0  # the 1 s target is measured by bench/live_tail_delay.py, not asserted on a busy CI box
