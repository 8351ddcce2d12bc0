"""Alerts with hysteresis, in event time, through the real broker; and run boundaries that change nothing."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer

from infra.kafka_admin import admin_client, ensure_topics
from infra.kafka_broker import LocalKafka
from pipelines.alerts import AlertChange, Timeline, advance, alert_json, alert_message
from pipelines.labeling import read_dataset, run_labeling
from pipelines.records import HOUR_US, PredictionRecord
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from precursor.contracts.alerting import AlertRule
from precursor.contracts.messages import Alert, EdgeEvent, Prediction, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import PredictionStore, connect
from tests.test_pipeline_labeling import T0, FleetHistory

RULE = PipelineSettings().alert_rule  # raise at 0.7 (no threshold of its own) after 2 windows, clear below 0.42 after 1


def record(
    hour: int,
    risk: float,
    *,
    seq: int | None = None,
    offset: int | None = None,
    threshold: float | None = None,
    model: str = "lm",
) -> PredictionRecord:
    end = hour * HOUR_US
    return PredictionRecord(
        "e", hour if seq is None else seq, "m", end - HOUR_US, end, 24.0, (("failure", risk),), model, "1", end, 0,
        hour if offset is None else offset, threshold,
    )  # fmt: skip


def changes(
    timeline: Timeline, arrivals: Sequence[PredictionRecord], lateness_h: float = 0, rule: AlertRule = RULE
) -> list[tuple[int, str]]:
    """The alert changes the arrivals make, decided as they arrive: no later window is needed."""
    result = advance(timeline, arrivals, rule, int(lateness_h * HOUR_US))
    return [(c.at_us // HOUR_US, c.state) for c in result.changes]


def test_an_alert_needs_consecutive_windows_to_raise_and_a_lower_risk_to_clear() -> None:
    risks = [0.8, 0.5, 0.9, 0.95, 0.6, 0.8, 0.3, 0.75, 0.72, 0.1]
    assert changes(Timeline(), [record(h, r) for h, r in enumerate(risks, start=1)]) == [
        (4, "raised"), (7, "cleared"), (9, "raised"), (10, "cleared"),
    ]  # fmt: skip
    # Risk that wobbles around one threshold never raises twice: no alert storm.
    wobble = [0.71, 0.69] * 10 + [0.9, 0.9] + [0.5, 0.65, 0.45, 0.55] * 5
    assert changes(Timeline(), [record(h, r) for h, r in enumerate(wobble, start=1)]) == [(22, "raised")]


def test_a_machine_above_its_models_threshold_for_two_windows_is_alerted_and_not_at_a_fixed_point() -> None:
    """The demo's defect: the LM chose 0.269 on validation, the pipeline alerted at a fixed 0.7."""
    lm = [record(h, 0.3, threshold=0.269) for h in (1, 2)]
    assert changes(Timeline(), lm) == [(2, "raised")]
    fixed = PipelineSettings(alert_threshold=0.7).alert_rule  # what the pipeline did before, now an explicit choice
    assert changes(Timeline(), lm, rule=fixed) == []
    # A baseline that carries no threshold is judged at the configured default.
    assert changes(Timeline(), [record(h, 0.3) for h in (1, 2)]) == []
    assert changes(Timeline(), [record(h, 0.3) for h in (1, 2)], rule=AlertRule(default_threshold=0.25)) == [
        (2, "raised")
    ]


def test_a_fleet_overrides_the_operating_point_per_model_name_or_for_every_model() -> None:
    rule = PipelineSettings(alert_model_thresholds={"lm": 0.5}, alert_threshold=0.2).alert_rule
    lm = [record(h, 0.4, threshold=0.269) for h in (1, 2)]
    baseline = [record(h, 0.25, model="drift-zscore", threshold=0.9) for h in (1, 2)]
    assert changes(Timeline(), lm, rule=rule) == []  # the per-model override (0.5) wins over the model's 0.269
    assert changes(Timeline(), baseline, rule=rule) == [(2, "raised")]  # the fleet-wide 0.2 over the model's 0.9
    assert changes(Timeline(), lm) == [(2, "raised")]  # no override: the model's own 0.269


def test_the_override_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_PIPELINE_ALERT_MODEL_THRESHOLDS", '{"precursor-lm": 0.35}')
    monkeypatch.setenv("PRECURSOR_PIPELINE_ALERT_CLEAR_FACTOR", "0.5")
    rule = PipelineSettings().alert_rule
    assert rule.threshold_for("precursor-lm", 0.269) == 0.35 and rule.threshold_for("other", 0.269) == 0.269
    assert rule.clear_below(0.35) == 0.175


def test_a_retired_threshold_variable_is_refused_with_what_to_set_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_PIPELINE_ALERT_RAISE_THRESHOLD", "0.5")
    with pytest.raises(ValueError, match=r"PRECURSOR_PIPELINE_ALERT_RAISE_THRESHOLD is retired.*ALERT_THRESHOLD"):
        PipelineSettings()


def test_hysteresis_is_relative_to_the_models_threshold() -> None:
    rule = AlertRule(clear_factor=0.5)  # clears below 0.269 * 0.5 = 0.1345
    risks = [0.3, 0.28, 0.2, 0.15, 0.14, 0.27, 0.13, 0.3, 0.29]
    arrivals = [record(h, r, threshold=0.269) for h, r in enumerate(risks, start=1)]
    # Below the threshold but above the clear level (0.2, 0.15, 0.14) keeps the alert; 0.13 clears it.
    assert changes(Timeline(), arrivals, rule=rule) == [(2, "raised"), (7, "cleared"), (9, "raised")]
    with pytest.raises(ValueError, match="clear_factor"):
        AlertRule(clear_factor=1.0)


def test_the_qualifying_prediction_raises_its_alert_in_the_run_that_reads_it() -> None:
    first = advance(Timeline(), [record(1, 0.9)], RULE, HOUR_US)
    assert first.changes == [] and first.decided == 1
    second = advance(Timeline.from_json(first.timeline.to_json()), [record(2, 0.9)], RULE, HOUR_US)
    assert [(c.at_us // HOUR_US, c.state, c.threshold) for c in second.changes] == [(2, "raised", 0.7)]
    assert "pending" not in second.timeline.to_json()  # nothing waits for a newer window


def test_late_predictions_within_the_allowed_lateness_count_in_arrival_order_and_later_ones_are_left_out() -> None:
    in_order = [record(h, r) for h, r in enumerate([0.1, 0.8, 0.8, 0.1, 0.1, 0.1], start=1)]
    shuffled = [in_order[i] for i in (0, 2, 1, 4, 3, 5)]  # hour 3 arrives before hour 2
    shuffled = [r._replace(offset=i) for i, r in enumerate(shuffled)]
    assert changes(Timeline(), in_order) == [(3, "raised"), (4, "cleared")]
    # Decided as they arrive: hour 2 (late, but within the hour allowed) completes the streak, hour 5 clears.
    assert changes(Timeline(), shuffled, lateness_h=1) == [(2, "raised"), (5, "cleared")]
    # Two hours behind the newest with one hour allowed: too late, so hour 3 alone cannot raise.
    late = [in_order[i]._replace(offset=k) for k, i in enumerate((0, 2, 3, 4, 1, 5))]
    result = advance(Timeline(), late, RULE, HOUR_US)
    assert result.too_late == 1 and result.changes == []


def test_replays_and_retried_sends_across_runs_count_once() -> None:
    arrivals = [record(h, r) for h, r in enumerate([0.1, 0.8, 0.8, 0.8, 0.2], start=1)]
    first = advance(Timeline(), arrivals[:3], RULE, HOUR_US)
    carried = Timeline.from_json(first.timeline.to_json())
    # A crash replays the last run's records: within the lateness they are known, older ones are too late.
    replay = advance(carried, arrivals[:3], RULE, HOUR_US)
    assert (replay.duplicates, replay.too_late, replay.changes) == (2, 1, [])
    assert replay.timeline.to_json() == first.timeline.to_json()
    # An edge's retried send arrives again at a new offset: the same (edge_id, seq) counts once.
    retried = arrivals[2]._replace(offset=99)
    second = advance(carried, [retried, *arrivals[3:]], RULE, HOUR_US)
    assert second.duplicates == 1 and [(c.at_us // HOUR_US, c.state) for c in second.changes] == [(5, "cleared")]


def test_a_timeline_saved_with_pending_predictions_has_them_decided_by_the_next_run() -> None:
    """Stores written while alerts waited for the watermark carry undecided predictions; none is lost."""
    old = Timeline(newest_us=3 * HOUR_US, pending=[record(2, 0.9), record(3, 0.9)])
    text = old.to_json()
    assert "pending" in text and "recent" in text
    result = advance(Timeline.from_json(text), [record(4, 0.1)], RULE, 0)
    assert [(c.at_us // HOUR_US, c.state) for c in result.changes] == [(3, "raised"), (4, "cleared")]
    assert result.timeline.pending == [] and result.decided == 3


RISKS = st.lists(st.sampled_from([0.05, 0.15, 0.25, 0.3, 0.5, 0.75, 0.9]), min_size=1, max_size=40)


@hypothesis.settings(max_examples=150, deadline=None)
@given(
    risks=RISKS,
    thresholds=st.lists(st.sampled_from([None, 0.269, 0.14, 0.7]), min_size=1, max_size=3),
    swaps=st.lists(st.integers(0, 39), max_size=6),
    cuts=st.lists(st.integers(0, 40), max_size=5),
    replays=st.lists(st.integers(0, 39), max_size=4),
)
def test_every_prediction_is_decided_once_the_same_however_the_stream_is_cut_into_runs(
    risks: list[float], thresholds: list[float | None], swaps: list[int], cuts: list[int], replays: list[int]
) -> None:
    arrivals = [
        record(h, r, threshold=thresholds[h % len(thresholds)], model=f"m{h % len(thresholds)}")
        for h, r in enumerate(risks, start=1)
    ]
    for i in swaps:  # neighbours arrive out of order, within the allowed lateness
        if i + 1 < len(arrivals):
            arrivals[i], arrivals[i + 1] = arrivals[i + 1], arrivals[i]
    arrivals = [r._replace(offset=k) for k, r in enumerate(arrivals)]
    lateness = HOUR_US
    whole = advance(Timeline(), arrivals, RULE, lateness)

    bounds = sorted({0, len(arrivals), *(c for c in cuts if c <= len(arrivals))})
    timeline, found = Timeline(), []
    for lo, hi in itertools.pairwise(bounds):
        # A crash before the offsets were committed replays some of the last run's records at their old offsets.
        again = [arrivals[i] for i in replays if i < lo]
        step_ = advance(Timeline.from_json(timeline.to_json()), [*again, *arrivals[lo:hi]], RULE, lateness)
        found += step_.changes
        timeline = step_.timeline
    assert found == whole.changes
    assert timeline.to_json() == whole.timeline.to_json()


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
    # Each prediction was decided in the run that read it: no timeline holds any back for a newer window.
    timelines = PredictionStore(tmp_path / "two.duckdb").alert_timelines()
    assert len(timelines) == 4 and not any("pending" in t for t in timelines.values())

    on_kafka = consumed_alerts(kafka_settings, len(one))
    assert sorted((a.machine_id, a.kind, a.state, a.at.strftime("%Y-%m-%dT%H:%M"), a.risk) for a in on_kafka) == one
    assert all(a.at >= T0 and a.model_version == "1" for a in on_kafka)

    label_one = run_labeling(tmp_path / "one.duckdb", tmp_path / "labels-one", settings=settings)
    label_two = run_labeling(tmp_path / "two.duckdb", tmp_path / "labels-two", settings=settings)
    assert label_one.outcomes == label_two.outcomes and label_one.outcomes["bearing"] == 24
    assert read_dataset(tmp_path / "labels-one").equals(read_dataset(tmp_path / "labels-two"))
    assert label_one.examples + label_one.pending == 4 * 60


_IDENTIFIERS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,40}", fullmatch=True)


@given(
    machine=_IDENTIFIERS,
    kind=_IDENTIFIERS,
    state=st.sampled_from(["raised", "cleared"]),
    risk=st.one_of(st.floats(0, 1), st.integers(0, 1)),
    at_us=st.integers(0, 253_402_300_799_999_999),
    version=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=64),
)
@hypothesis.settings(max_examples=300, deadline=None)
def test_alert_json_is_the_alert_contracts_own_bytes(
    machine: str, kind: str, state: str, risk: float, at_us: int, version: str
) -> None:
    """The alert producer writes an alert's JSON without building the pydantic model: byte for byte what the model
    would encode, for any time, any probability (ints, tiny and long floats) and any version text."""
    change = AlertChange(machine, kind, state, risk, at_us, version, 0.5)  # type: ignore[arg-type]
    assert alert_json(change) == encode(alert_message(change))
    assert decode(Alert, alert_json(change)).at.microsecond == at_us % 1_000_000
