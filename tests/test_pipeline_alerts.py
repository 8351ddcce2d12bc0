"""Alerts with hysteresis, in event time, through the real broker; and run boundaries that change nothing."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from contracts.messages import Alert, EdgeEvent, Prediction, decode, encode
from contracts.settings import KafkaSettings
from infra.kafka_admin import admin_client, ensure_topics
from infra.kafka_broker import LocalKafka
from pipelines.alerts import Timeline, advance
from pipelines.labeling import read_dataset, run_labeling
from pipelines.records import HOUR_US, PredictionRecord
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from store import connect
from tests.test_pipeline_labeling import T0, FleetHistory

RULE = PipelineSettings().alert_rule  # raise at 0.7 after 2 windows, clear below 0.4 after 1


def record(hour: int, risk: float, *, seq: int | None = None, offset: int | None = None) -> PredictionRecord:
    end = hour * HOUR_US
    return PredictionRecord(
        "e", hour if seq is None else seq, "m", end - HOUR_US, end, 24.0, (("failure", risk),), "lm", "1", end, 0,
        hour if offset is None else offset,
    )  # fmt: skip


def changes(timeline: Timeline, arrivals: Sequence[PredictionRecord], lateness_h: float = 0) -> list[tuple[int, str]]:
    """The alert changes once every arrival is final: a later window (still pending itself) moves the watermark."""
    closing = record(1000, 0.0, offset=10**6)
    result = advance(timeline, [*arrivals, closing], RULE, int(lateness_h * HOUR_US))
    return [(c.at_us // HOUR_US, c.state) for c in result.changes]


def test_an_alert_needs_consecutive_windows_to_raise_and_a_lower_risk_to_clear() -> None:
    risks = [0.8, 0.5, 0.9, 0.95, 0.6, 0.8, 0.3, 0.75, 0.72, 0.1]
    assert changes(Timeline(), [record(h, r) for h, r in enumerate(risks, start=1)]) == [
        (4, "raised"), (7, "cleared"), (9, "raised"), (10, "cleared"),
    ]  # fmt: skip
    # Risk that wobbles around one threshold never raises twice: no alert storm.
    wobble = [0.71, 0.69] * 10 + [0.9, 0.9] + [0.5, 0.65, 0.45, 0.55] * 5
    assert changes(Timeline(), [record(h, r) for h, r in enumerate(wobble, start=1)]) == [(22, "raised")]


def test_late_predictions_within_the_allowed_lateness_are_put_in_order_and_later_ones_are_left_out() -> None:
    in_order = [record(h, r) for h, r in enumerate([0.1, 0.8, 0.8, 0.1, 0.1, 0.1], start=1)]
    shuffled = [in_order[i] for i in (0, 2, 1, 4, 3, 5)]  # hour 3 arrives before hour 2
    shuffled = [r._replace(offset=i) for i, r in enumerate(shuffled)]
    assert (
        changes(Timeline(), shuffled, lateness_h=1) == changes(Timeline(), in_order) == [(3, "raised"), (4, "cleared")]
    )
    # Two hours behind the newest with one hour allowed: too late, so hour 3 alone cannot raise.
    late = [in_order[i]._replace(offset=k) for k, i in enumerate((0, 2, 3, 4, 1, 5))]
    result = advance(Timeline(), late, RULE, HOUR_US)
    assert result.too_late == 1 and result.changes == []


def test_the_watermark_holds_back_the_newest_predictions_and_a_later_run_decides_them() -> None:
    risks = [0.1, 0.8, 0.8, 0.8, 0.2, 0.1, 0.9, 0.9]
    arrivals = [record(h, r) for h, r in enumerate(risks, start=1)]
    whole = advance(Timeline(), arrivals, RULE, 2 * HOUR_US)
    first = advance(Timeline(), arrivals[:4], RULE, 2 * HOUR_US)
    assert [r.window_end_us // HOUR_US for r in first.timeline.pending] == [2, 3, 4]  # the watermark is at hour 2
    second = advance(Timeline.from_json(first.timeline.to_json()), arrivals[4:], RULE, 2 * HOUR_US)
    assert first.changes + second.changes == whole.changes
    assert second.timeline.to_json() == whole.timeline.to_json()
    # A replay of records already pending is dropped, not counted twice.
    replay = advance(Timeline.from_json(first.timeline.to_json()), arrivals[2:4], RULE, 2 * HOUR_US)
    assert replay.duplicates == 2 and replay.timeline.to_json() == first.timeline.to_json()


# Through the broker ------------------------------------------------------------------------------------------------


def produce(settings: KafkaSettings, messages: Sequence[Prediction | EdgeEvent]) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=5)
    for m in messages:
        topic = settings.topics.predictions if isinstance(m, Prediction) else settings.topics.events
        producer.send(topic, key=m.machine_id.encode(), value=encode(m))
    producer.flush()
    producer.close()


def stored_alerts(store: Path) -> list[tuple[str, str, str, str, float]]:
    with connect(store, read_only=True) as con:
        return con.execute(
            "SELECT machine_id, kind, state, strftime(ts, '%Y-%m-%dT%H:%M'), risk FROM alerts ORDER BY ALL"
        ).fetchall()


def consumed_alerts(settings: KafkaSettings, expected: int) -> list[Alert]:
    consumer = KafkaConsumer(
        settings.topics.alerts, **settings.client_kwargs(), auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    alerts = []
    for message in consumer:
        alerts.append(decode(Alert, message.value))
        if len(alerts) == expected:
            break
    consumer.close()
    return alerts


@pytest.fixture
def second_topics(kafka_broker: LocalKafka) -> Iterator[KafkaSettings]:
    """Another set of topics on the session broker, for a second copy of the same stream."""
    settings = kafka_broker.kafka_settings(topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, settings.topics.specs())
    yield settings
    with admin_client(settings, timeout_s=10) as admin:
        admin.delete_topics([spec.name for spec in settings.topics.specs()], raise_errors=False)


def wavy(machine: str, hour: float) -> dict[str, float]:
    """Risk that rises and falls through both thresholds, a different phase per machine."""
    phase = int(machine.split("-")[1])
    value = 0.5 + 0.45 * math.sin(hour / 3.0 + phase)
    return {"failure": round(value, 4), "bearing": round(value * 0.8, 4)}


@pytest.mark.integration
def test_one_run_or_two_give_the_same_alerts_labels_and_kafka_messages(
    tmp_path: Path, kafka_settings: KafkaSettings, second_topics: KafkaSettings
) -> None:
    history = FleetHistory(machines=4, hours=60, failures=[("pump-01", 30.5, "failure:bearing")])
    messages = history.messages(wavy)
    # Two predictions of pump-02 swap places on the wire: within the allowed lateness, so still in order for alerts.
    first_swap = next(i for i, m in enumerate(messages) if isinstance(m, Prediction) and m.machine_id == "pump-02")
    later = next(i for i, m in enumerate(messages) if i > first_swap and m.machine_id == "pump-02")
    messages[first_swap], messages[later] = messages[later], messages[first_swap]
    settings = PipelineSettings(allowed_lateness="90m")

    produce(kafka_settings, messages)
    whole = run_once(kafka_settings, tmp_path / "one.duckdb", pipeline_settings=settings)
    cut = len(messages) // 2 + 7
    produce(second_topics, messages[:cut])
    part1 = run_once(second_topics, tmp_path / "two.duckdb", pipeline_settings=settings)
    produce(second_topics, messages[cut:])
    part2 = run_once(second_topics, tmp_path / "two.duckdb", pipeline_settings=settings)

    assert whole.read == part1.read + part2.read == len(messages)
    assert whole.too_late == part1.too_late + part2.too_late == 0
    one, two = stored_alerts(tmp_path / "one.duckdb"), stored_alerts(tmp_path / "two.duckdb")
    assert one == two
    assert whole.alerts_raised == part1.alerts_raised + part2.alerts_raised >= 8
    assert {(m, k) for m, k, *_ in one} == {(f"pump-0{i}", k) for i in range(4) for k in ("failure", "bearing")}
    assert whole.pending == part2.pending > 0  # the newest windows wait for the watermark

    on_kafka = consumed_alerts(kafka_settings, len(one))
    assert sorted((a.machine_id, a.kind, a.state, a.at.strftime("%Y-%m-%dT%H:%M"), a.risk) for a in on_kafka) == one
    assert all(a.at >= T0 and a.model_version == "1" for a in on_kafka)

    label_one = run_labeling(tmp_path / "one.duckdb", tmp_path / "labels-one", settings=settings)
    label_two = run_labeling(tmp_path / "two.duckdb", tmp_path / "labels-two", settings=settings)
    assert label_one.outcomes == label_two.outcomes and label_one.outcomes["bearing"] == 24
    assert read_dataset(tmp_path / "labels-one").equals(read_dataset(tmp_path / "labels-two"))
    assert label_one.examples + label_one.pending == 4 * 60
