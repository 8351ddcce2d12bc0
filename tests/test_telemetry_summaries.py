"""Telemetry summaries end to end: the contract, the edge's producer (values, missing readings, rate limit, off
switch, restarts, the outbox's drop order), the store's layout, and the real spine edge -> Kafka -> Beam -> store ->
API."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from edge_agent.agent import EdgeAgent
from edge_agent.config import ConfigError, EdgeConfig, TelemetrySummarySpec
from edge_agent.outbox import Outbox
from edge_agent.publisher import KafkaPublisher
from edge_agent.scorers import load_scorer
from edge_agent.sources import FileReplay
from edge_agent.summaries import PeriodSummary, SensorStats, summary_messages
from pipelines.run import run_once
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.messages import (
    MAX_SUMMARY_SENSORS,
    ContractError,
    Prediction,
    TelemetrySummary,
    decode,
    encode,
)
from precursor.contracts.settings import KafkaSettings
from precursor.store import PredictionStore, connect
from tests.fixtures_api import TOKEN, serving
from tests.test_edge_agent import ListSink
from tests.test_edge_outbox import edge_config, run_batches, write_replay

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SENSORS = ("pressure", "temp", "vib")


def write_gappy_telemetry(path: Path, machines: int = 3, minutes: int = 120) -> list[tuple[str, float, dict]]:
    """A reading every 2 minutes per machine, some values blank (missing); returns what was written."""
    rows, written = ["timestamp,machine_id,pressure,temp,vib"], []
    for t in range(0, minutes, 2):
        for m in range(machines):
            values = {"pressure": 3 + m / 10, "temp": 40 + m + t / 7, "vib": round(0.1 * (t % 9), 2)}
            if (t + m) % 5 == 0:
                values["vib"] = None  # missing now and then
            if m == 2 and 40 <= t < 60:
                values["temp"] = None  # a sensor out for a whole period of machine 2
            at = T0 + timedelta(minutes=t)
            rows.append(
                f"{at:%Y-%m-%dT%H:%M:%SZ},pump-{m},"
                + ",".join("" if values[s] is None else str(values[s]) for s in SENSORS)
            )
            written.append((f"pump-{m}", at.timestamp(), values))
    path.write_text("\n".join(rows) + "\n")
    return written


def config(folder: Path, **summaries: object) -> EdgeConfig:
    return EdgeConfig.from_dict(
        {
            "edge_id": "edge-s",
            "sources": [{"type": "replay", "telemetry": "telemetry.csv"}],
            "window": {"length": "30m", "every": "10m", "min_points": 3},
            "state_dir": "state",
            **({"telemetry_summaries": summaries} if summaries else {}),
        },
        base=folder,
    )


def run_edge(cfg: EdgeConfig) -> tuple[EdgeAgent, list[object]]:
    sink = ListSink()
    agent = EdgeAgent(cfg, load_scorer(cfg.model), sink)
    agent.run(FileReplay(cfg.sources[0]))
    return agent, sink.messages


def summaries_in(messages: list[object]) -> list[TelemetrySummary]:
    return [m for m in messages if isinstance(m, TelemetrySummary)]


# --- the contract ---------------------------------------------------------------------------------------------------


def summary_json(**changes: object) -> dict:
    message = {
        "edge_id": "edge-1",
        "seq": 3,
        "machine_id": "pump-1",
        "window_start": "2026-03-01T00:00:00Z",
        "window_end": "2026-03-01T01:00:00Z",
        "readings": 6,
        "sensors": {"temp": {"mean": 41.5, "min": 40.0, "max": 43.0, "last": 42.0, "count": 6}},
    }
    return message | changes


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"sensors": {}}, "sensors"),
        ({"sensors": {"temp": {"mean": 41.5, "min": 40.0, "max": 43.0, "last": 44.0, "count": 6}}}, "between min"),
        ({"sensors": {"temp": {"mean": 41.5, "min": 40.0, "max": 43.0, "last": 42.0, "count": 7}}}, "readings"),
        ({"sensors": {"temp": {"mean": 41.5, "min": 40.0, "max": 43.0, "last": 42.0, "count": 0}}}, "count"),
        ({"window_end": "2026-03-01T00:00:00Z"}, "not after window_start"),
        ({"window_end": "2026-03-01T01:00:00"}, "window_end"),  # naive: no timezone
        ({"sensors": {"1temp": {"mean": 1, "min": 1, "max": 1, "last": 1, "count": 1}}}, "1temp"),
        ({"readings": 0}, "readings"),
        ({"extra": 1}, "extra"),
    ],
)
def test_the_contract_names_what_is_wrong(changes: dict, named: str) -> None:
    with pytest.raises(ContractError, match=named):
        decode(TelemetrySummary, json.dumps(summary_json(**changes)))


def test_the_contract_refuses_non_finite_values_and_too_many_sensors() -> None:
    raw = json.dumps(summary_json()).replace("41.5", "NaN").encode()
    with pytest.raises(ContractError, match=r"sensors\.temp\.mean"):
        decode(TelemetrySummary, raw)
    many = {f"s{i}": {"mean": 1, "min": 1, "max": 1, "last": 1, "count": 1} for i in range(MAX_SUMMARY_SENSORS + 1)}
    with pytest.raises(ContractError, match="sensors"):
        decode(TelemetrySummary, json.dumps(summary_json(sensors=many)))
    good = decode(TelemetrySummary, json.dumps(summary_json()))
    assert decode(TelemetrySummary, encode(good)) == good


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(["seq", "machine_id", "window_start", "window_end", "readings", "sensors"]), value=json_values
)
def test_any_value_in_any_field_parses_or_raises_a_contract_error(field: str, value: object) -> None:
    try:
        raw = json.dumps(summary_json(**{field: value}))
    except ValueError:
        return  # NaN/Infinity are not JSON; covered above
    try:
        decode(TelemetrySummary, raw)
    except ContractError as err:
        assert str(err).startswith("TelemetrySummary:")


# --- the edge's producer --------------------------------------------------------------------------------------------


def test_each_period_summarizes_its_readings_and_leaves_missing_ones_out(tmp_path: Path) -> None:
    written = write_gappy_telemetry(tmp_path / "telemetry.csv")
    agent, messages = run_edge(config(tmp_path, enabled=True, interval="20m"))
    sent = summaries_in(messages)
    assert sent and agent.stats.summaries == len(sent)
    for s in sent:
        rows = [
            v for m, t, v in written if m == s.machine_id and s.window_start.timestamp() <= t < s.window_end.timestamp()
        ]
        assert s.readings == len(rows)
        for sensor in SENSORS:
            values = [v[sensor] for v in rows if v[sensor] is not None]
            if not values:
                assert sensor not in s.sensors  # nothing to say about a sensor that was out all period
                continue
            got = s.sensors[sensor]
            assert got.count == len(values)
            assert (got.min, got.max, got.last) == (min(values), max(values), values[-1])
            assert math.isclose(got.mean, sum(values) / len(values), rel_tol=1e-12)
    # pump-2's temperature sensor was out from 00:40 to 01:00: that period reports no temp for it.
    out = next(s for s in sent if s.machine_id == "pump-2" and s.window_start == T0 + timedelta(minutes=40))
    assert "temp" not in out.sensors and out.sensors["vib"].count < out.readings


def test_a_machine_sends_at_most_one_summary_per_interval_and_each_reading_once(tmp_path: Path) -> None:
    written = write_gappy_telemetry(tmp_path / "telemetry.csv", minutes=240)
    for interval, minutes in ((None, 10), ("30m", 30)):
        spec = {"enabled": True} | ({"interval": interval} if interval else {})
        _, messages = run_edge(config(tmp_path, **spec))
        sent = summaries_in(messages)
        per_machine: dict[str, list[TelemetrySummary]] = defaultdict(list)
        for s in sent:
            per_machine[s.machine_id].append(s)
        for machine, summaries in per_machine.items():
            starts = [s.window_start for s in summaries]
            # On the period grid, one per period, in order, none skipped.
            assert all(s.window_end - s.window_start == timedelta(minutes=minutes) for s in summaries)
            assert all(t.timestamp() % (minutes * 60) == 0 for t in starts)
            assert starts == [T0 + timedelta(minutes=minutes) * i for i in range(len(starts))]
            # Every reading of a period that ended before the machine's last boundary is counted, once.
            end = summaries[-1].window_end.timestamp()
            assert sum(s.readings for s in summaries) == sum(1 for m, t, _ in written if m == machine and t < end)
        assert set(per_machine) == {"pump-0", "pump-1", "pump-2"}


def test_summaries_are_off_by_default_and_change_no_other_figure(tmp_path: Path) -> None:
    write_gappy_telemetry(tmp_path / "telemetry.csv")
    off_agent, off = run_edge(config(tmp_path))
    on_agent, on = run_edge(config(tmp_path, enabled=True))
    assert summaries_in(off) == [] and off_agent.stats.summaries == 0 and off_agent.summarizer is None
    assert len(summaries_in(on)) == on_agent.stats.summaries > 0
    # Predictions and every other count are the same with summaries on (only the sequence numbers interleave).
    assert [p.model_dump(exclude={"seq", "emitted_at"}) for p in off if isinstance(p, Prediction)] == [
        p.model_dump(exclude={"seq", "emitted_at"}) for p in on if isinstance(p, Prediction)
    ]
    figures = ("readings", "events", "windows", "predictions", "quarantined", "scoring_errors")
    assert [getattr(off_agent.stats, f) for f in figures] == [getattr(on_agent.stats, f) for f in figures]
    seqs = [m.seq for m in on]  # one sequence for everything an edge sends
    assert len(set(seqs)) == len(seqs)


def test_an_interval_the_edge_cannot_keep_is_refused_at_start(tmp_path: Path) -> None:
    for interval in ("15m", "40m"):  # not a multiple of window.every (10m); longer than window.length (30m)
        with pytest.raises(ConfigError, match=r"telemetry_summaries\.interval"):
            config(tmp_path, enabled=True, interval=interval)
    assert config(tmp_path, enabled=True, interval="30m").summary_interval == timedelta(minutes=30)
    assert config(tmp_path, enabled=False, interval="30m").summary_interval is None


def test_crashes_and_restarts_repeat_and_skip_no_summary(tmp_path: Path) -> None:
    write_replay(tmp_path)
    on = TelemetrySummarySpec(enabled=True, interval=timedelta(minutes=20))

    def with_summaries(state: str) -> EdgeConfig:
        return edge_config(tmp_path, state).model_copy(update={"telemetry_summaries": on})

    def sent(cfg: EdgeConfig) -> list[TelemetrySummary]:
        box = Outbox(cfg.state_dir / "outbox.sqlite", max_bytes=10**8)
        rows = box.reader().pending(10**6)
        return [decode(TelemetrySummary, r.value) for r in rows if r.kind == "telemetry"]

    clean = with_summaries("clean")
    run_batches(clean, commit_every=5, stop_after=None)
    crashy = with_summaries("crashy")
    run_batches(crashy, commit_every=5, stop_after=13)  # killed three batches after a commit
    run_batches(crashy, commit_every=3, stop_after=8)  # restarted, killed again
    run_batches(crashy, commit_every=4, stop_after=None)

    def periods(messages: list[TelemetrySummary]) -> list[tuple]:
        return sorted((m.machine_id, m.window_start, m.readings, m.sensors["temp"].mean) for m in messages)

    expected = periods(sent(clean))
    assert len(expected) == 3 * 11  # three machines, 20-minute periods ending 00:20 .. 03:40
    assert periods(sent(crashy)) == expected


def test_many_sensors_are_split_across_messages() -> None:
    stats = SensorStats(1.0, 0.5, 2.0, 1.5, 4)
    period = PeriodSummary("pump-1", 0, 3600, 4, {f"s{i:04d}": stats for i in range(MAX_SUMMARY_SENSORS + 10)})
    numbers = iter(range(100, 200))
    messages = summary_messages(period, "edge-1", numbers.__next__)
    assert [len(m.sensors) for m in messages] == [MAX_SUMMARY_SENSORS, 10]
    assert [m.seq for m in messages] == [100, 101]
    assert summary_messages(PeriodSummary("pump-1", 0, 3600, 4, {}), "edge-1", numbers.__next__) == []


def test_a_full_outbox_drops_summaries_first(tmp_path: Path) -> None:
    one = decode(TelemetrySummary, json.dumps(summary_json()))
    box = Outbox(tmp_path / "state.db", max_bytes=(len(encode(one)) + 64) * 12)
    for _ in range(10):
        box.stage(one.model_copy(update={"seq": box.next_seq()}))
    box.commit()
    for _ in range(4):
        box.stage(
            Prediction(
                edge_id="edge-1",
                seq=box.next_seq(),
                machine_id="pump-1",
                window_start=T0,
                window_end=T0,
                horizon_h=24,
                risk={"failure": 0.1},
                model_name="m",
                model_version="1",
            )
        )
    box.commit()
    assert box.dropped["telemetry"] >= 1 and box.dropped["prediction"] == 0
    assert [r.kind for r in box.reader().pending(100)].count("prediction") == 4


# --- the store ------------------------------------------------------------------------------------------------------


def test_a_store_with_the_first_summaries_layout_keeps_it_aside(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE telemetry_summaries (machine_id VARCHAR NOT NULL, sensor VARCHAR NOT NULL, "
            "window_start TIMESTAMPTZ NOT NULL, window_end TIMESTAMPTZ NOT NULL, value_mean DOUBLE, value_min DOUBLE, "
            "value_max DOUBLE, samples BIGINT NOT NULL, PRIMARY KEY (machine_id, sensor, window_end))"
        )
        con.execute("INSERT INTO telemetry_summaries VALUES ('m', 't', now(), now(), 1, 1, 1, 1)")
    with connect(path) as con:
        kept = con.execute("SELECT count(*) FROM telemetry_summaries_v1").fetchone()
        keys = con.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() "
            "WHERE table_name = 'telemetry_summaries' AND constraint_type = 'PRIMARY KEY'"
        ).fetchone()
    assert kept == (1,) and keys == (["edge_id", "seq", "sensor"],)


# --- the spine: edge -> Kafka -> Beam -> store -> API ---------------------------------------------------------------


class Recording:
    """The Kafka publisher, keeping a copy of each summary it sends."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        self.publisher = publisher
        self.summaries: list[TelemetrySummary] = []

    def send(self, message: object) -> None:
        if isinstance(message, TelemetrySummary):
            self.summaries.append(message)
        self.publisher.send(message)  # type: ignore[arg-type]

    def flush(self) -> None:
        self.publisher.flush()

    def close(self) -> None:
        self.publisher.close()


def summaries_through_the_spine(folder: Path, settings: KafkaSettings) -> tuple[Path, list[TelemetrySummary]]:
    """A small fleet's telemetry through a real edge agent (summaries on), the Kafka broker and the Beam pipeline
    into a store; returns the store and the summaries the edge sent."""
    write_gappy_telemetry(folder / "telemetry.csv", machines=3, minutes=180)
    cfg = config(folder, enabled=True, interval="20m")
    sink = Recording(KafkaPublisher(settings, summaries=True))
    try:
        EdgeAgent(cfg, load_scorer(cfg.model), sink).run(FileReplay(cfg.sources[0]))
    finally:
        sink.close()
    store = folder / "store.duckdb"
    report = run_once(settings, store)
    n = len(sink.summaries)
    rows = sum(len(s.sensors) for s in sink.summaries)
    assert n > 0 and (report.telemetry_read, report.telemetry_rows_stored, report.telemetry_dead_lettered) == (
        n,
        rows,
        0,
    )
    return store, sink.summaries


@pytest.mark.integration
def test_summaries_reach_the_store_and_the_api_exactly_once(tmp_path: Path, kafka_settings: KafkaSettings) -> None:
    store, sent = summaries_through_the_spine(tmp_path, kafka_settings)
    with connect(store, read_only=True) as con:
        stored = con.execute(
            "SELECT edge_id, seq, machine_id, sensor, window_end, value_mean, value_min, value_max, value_last, "
            "samples, readings FROM telemetry_summaries ORDER BY seq, sensor"
        ).fetchall()
        predictions = con.execute("SELECT count(*) FROM predictions").fetchone()
    assert stored == [
        (s.edge_id, s.seq, s.machine_id, name, s.window_end, v.mean, v.min, v.max, v.last, v.count, s.readings)
        for s in sorted(sent, key=lambda s: s.seq)
        for name, v in sorted(s.sensors.items())
    ]
    assert predictions and predictions[0] > 0  # predictions went their own way, counted as before

    # A retried send and a bad record: the one is dropped as a duplicate, the other dead-lettered with its reason.
    producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    producer.send(kafka_settings.topics.telemetry, key=b"pump-0", value=encode(sent[0]))
    bad = json.dumps(summary_json(machine_id="pump-0", readings=0)).encode()
    producer.send(kafka_settings.topics.telemetry, key=b"pump-0", value=bad)
    producer.flush()
    producer.close()
    again = run_once(kafka_settings, store)
    assert (again.telemetry_read, again.telemetry_rows_stored, again.telemetry_dead_lettered) == (2, 0, 1)
    assert again.read == 0  # no prediction or event counted for them
    # Even forced over every offset again, nothing is stored twice.
    assert run_once(kafka_settings, store, from_beginning=True).telemetry_rows_stored == 0
    with connect(store, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM telemetry_summaries").fetchone() == (len(stored),)

    # The API serves each sensor's line as the edge summarized it.
    app = create_app(ApiSettings(tokens=TOKEN, store=store), kafka_settings)
    with serving(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        for machine in ("pump-0", "pump-2"):
            answer = api.get(f"/api/v1/machines/{machine}/telemetry", params={"points": 5000}).json()
            mine = sorted((s for s in sent if s.machine_id == machine), key=lambda s: s.window_end)
            assert set(answer["sensors"]) == {n for s in mine for n in s.sensors}
            for sensor, points in answer["sensors"].items():
                want = [(s.window_end, s.sensors[sensor]) for s in mine if sensor in s.sensors]
                assert [(datetime.fromisoformat(p["t"]), p["mean"], p["last"], p["samples"]) for p in points] == [
                    (end, v.mean, v.last, v.count) for end, v in want
                ]
            timeline = api.get(f"/api/v1/machines/{machine}/timeline").json()
            assert set(timeline["telemetry"]) == set(answer["sensors"]) and timeline["risk"]
    assert PredictionStore(store).offsets("ingest-v0", kafka_settings.topics.telemetry)
