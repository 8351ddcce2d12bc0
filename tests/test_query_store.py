"""The store's questions (precursor/store/queries.py) against a store filled from the simulator, checked against the
messages
that went into it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from precursor.store import PredictionStore, connect
from precursor.store.queries import (
    ELEVATED_LOOKBACK,
    SqlRejected,
    check_range,
    parse_time_bound,
    reading,
)
from tests.fixtures_api import NEW_VERSION, OLD_VERSION, SimulatedStore, fill_store
from tests.fixtures_store import store_digest

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]

THRESHOLD = 0.7


@pytest.fixture(scope="module")
def sim(new_store: NewStore) -> SimulatedStore:
    return fill_store(new_store("store"))


@pytest.fixture(scope="module")
def sim_without_latest(new_store: NewStore) -> SimulatedStore:
    """The same fleet, but the writer has not kept latest_predictions: answers must not change."""
    return fill_store(new_store("store"), with_latest=False)


def expected_at_risk(sim: SimulatedStore) -> list[tuple[str, float]]:
    latest = sim.latest().values()
    return [(p.machine_id, p.max_risk) for p in sorted(latest, key=lambda p: (-p.max_risk, p.machine_id))]


def expected_since(sim: SimulatedStore, machine_id: str) -> datetime | None:
    """Start of the machine's current run of windows at or above the threshold (within the lookback)."""
    ps = sorted(sim.of(machine_id), key=lambda p: (p.window_end, p.seq))
    if not ps or ps[-1].max_risk < THRESHOLD:
        return None
    bound = ps[-1].window_end - ELEVATED_LOOKBACK
    since = ps[-1].window_end
    for p in reversed(ps):
        if p.max_risk < THRESHOLD or p.window_end < bound:
            break
        since = p.window_end
    return since


@pytest.mark.parametrize("fixture", ["sim", "sim_without_latest"])
def test_at_risk_is_each_machines_latest_prediction_riskiest_first(
    fixture: str, store_backend: str, request: pytest.FixtureRequest
) -> None:
    sim: SimulatedStore = request.getfixturevalue(fixture)
    with reading(sim.path) as store:
        page = store.at_risk(limit=1000, threshold=THRESHOLD)
    assert page.total == len(sim.latest())
    assert [(r["machine_id"], r["max_risk"]) for r in page.rows] == expected_at_risk(sim)
    latest = sim.latest()
    for row in page.rows:
        p = latest[row["machine_id"]]
        assert row["risk"] == p.risk and row["window_end"] == p.window_end and row["model_version"] == p.model_version
        assert row["elevated_since"] == expected_since(sim, row["machine_id"])


def test_the_fleet_has_machines_at_risk_and_calm_ones(sim: SimulatedStore) -> None:
    risks = [p.max_risk for p in sim.latest().values()]
    assert any(r >= THRESHOLD for r in risks) and any(r < 0.4 for r in risks)  # the fixture is worth testing with


def test_at_risk_pages_and_filters(sim: SimulatedStore) -> None:
    want = expected_at_risk(sim)
    with reading(sim.path) as store:
        first = store.at_risk(limit=3, offset=0)
        second = store.at_risk(limit=3, offset=3)
        beyond = store.at_risk(limit=3, offset=len(want) + 5)
        edge_b = store.at_risk(limit=100, edge_id="edge-b")
        risky = store.at_risk(limit=100, min_risk=THRESHOLD)
        new = store.at_risk(limit=100, model_version=NEW_VERSION)
    assert [r["machine_id"] for r in first.rows + second.rows] == [m for m, _ in want[:6]]
    assert beyond.rows == [] and beyond.total == len(want)
    assert {r["machine_id"] for r in edge_b.rows} == {m for m, e in sim.edge_of.items() if e == "edge-b"}
    assert [r["machine_id"] for r in risky.rows] == [m for m, r in want if r >= THRESHOLD]
    assert {r["machine_id"] for r in new.rows} == {
        p.machine_id for p in sim.latest().values() if p.model_version == NEW_VERSION
    }


def test_open_alerts_are_the_raised_ones_not_cleared_since(sim: SimulatedStore) -> None:
    last: dict[tuple[str, str], dict] = {}
    for alert in sorted(sim.alerts, key=lambda a: a["ts"]):
        last[(alert["machine_id"], alert["kind"])] = alert
    still_open = {(m, k) for (m, k), a in last.items() if a["state"] == "raised"}
    with reading(sim.path) as store:
        rows = store.at_risk(limit=1000).rows
        summary = store.fleet_summary(THRESHOLD)
    assert {(r["machine_id"], a["kind"]) for r in rows for a in r["open_alerts"]} == still_open
    assert summary["open_alerts"] == len(still_open)
    assert summary["at_risk"] == sum(1 for p in sim.latest().values() if p.max_risk >= THRESHOLD)


def test_machine_history_is_newest_first_and_honours_the_range(sim: SimulatedStore) -> None:
    machine = sim.machines[0]
    ps = sorted(sim.of(machine), key=lambda p: (p.window_end, p.seq), reverse=True)
    since, until = ps[30].window_end, ps[10].window_end
    with reading(sim.path) as store:
        page = store.machine_history(machine, limit=5, offset=2)
        ranged = store.machine_history(machine, limit=1000, since=since, until=until)
    assert page.total == len(ps)
    assert [r["seq"] for r in page.rows] == [p.seq for p in ps[2:7]]
    assert [r["seq"] for r in ranged.rows] == [p.seq for p in ps if since <= p.window_end <= until]


def test_failures_carry_the_first_warning_and_the_lead_time(sim: SimulatedStore) -> None:
    failures = sim.failures()
    assert failures, "the simulated fleet should fail at least once"
    with reading(sim.path) as store:
        rows = store.failures(threshold=THRESHOLD, limit=1000).rows
    assert len(rows) == len(failures)
    for row in rows:
        earlier = [f.timestamp for f in sim.failures(row["machine_id"]) if f.timestamp < row["failed_at"]]
        previous = max(earlier) if earlier else None
        covering = [
            p
            for p in sim.of(row["machine_id"])
            if p.window_end < row["failed_at"]
            and p.window_end >= row["failed_at"] - timedelta(hours=p.horizon_h)
            and (previous is None or p.window_end > previous)
        ]
        warnings = [p.window_end for p in covering if p.max_risk >= THRESHOLD]
        assert row["warned_at"] == (min(warnings) if warnings else None)
        assert row["caught"] is bool(warnings)
        if warnings:
            assert row["lead_time_h"] == pytest.approx((row["failed_at"] - min(warnings)).total_seconds() / 3600)
        assert row["peak_risk"] == (max(p.max_risk for p in covering) if covering else None)
    assert any(r["caught"] for r in rows)


def test_risk_series_keeps_every_peak_in_few_points(sim: SimulatedStore) -> None:
    machine = max(sim.machines, key=lambda m: max(p.max_risk for p in sim.of(m)))
    with reading(sim.path) as store:
        points = store.risk_series(machine, points=20)
        every = store.risk_series(machine, points=100_000)
    assert len(points) <= 21
    assert max(p["risk"] for p in points) == max(p.max_risk for p in sim.of(machine))
    assert sum(p["windows"] for p in points) == len(sim.of(machine))
    assert len(every) == len(sim.of(machine))


def test_rollout_says_which_edge_runs_the_newest_model(sim: SimulatedStore) -> None:
    with reading(sim.path) as store:
        edges = {e["edge_id"]: e for e in store.rollout()}
        versions = store.model_versions()
    assert edges["edge-a"]["status"] == "current" and edges["edge-a"]["running_version"] == NEW_VERSION
    assert edges["edge-b"]["status"] == "behind" and edges["edge-b"]["running_version"] == OLD_VERSION
    assert edges["edge-b"]["heartbeat"]["health"] == "degraded"
    assert {(v["edge_id"], v["model_version"]) for v in versions} == {
        (p.edge_id, p.model_version) for p in sim.predictions
    }
    for v in versions:
        mine = [p for p in sim.predictions if (p.edge_id, p.model_version) == (v["edge_id"], v["model_version"])]
        assert v["predictions"] == len(mine)
        assert v["first_window_end"] == min(p.window_end for p in mine)


def test_quality_counts_each_window_against_what_happened(sim: SimulatedStore) -> None:
    newest = max([p.window_end for p in sim.predictions] + [e.timestamp for e in sim.events])
    with reading(sim.path) as store:
        rows = store.quality(bucket=timedelta(days=1), threshold=THRESHOLD)
    assert {r["source"] for r in rows} == {"computed"}
    totals = {k: sum(r[k] for r in rows) for k in ("tp", "fp", "fn", "tn", "windows")}
    want = dict.fromkeys(("tp", "fp", "fn", "tn", "windows"), 0)
    for p in sim.predictions:
        horizon = timedelta(hours=p.horizon_h)
        if p.window_end + horizon > newest:
            continue  # the outcome is not known yet
        failed = any(p.window_end < f.timestamp <= p.window_end + horizon for f in sim.failures(p.machine_id))
        warned = p.max_risk >= THRESHOLD
        key = ("tp" if warned else "fn") if failed else ("fp" if warned else "tn")
        want[key] += 1
        want["windows"] += 1
    assert totals == want


def test_telemetry_summaries_come_back_per_sensor(sim: SimulatedStore) -> None:
    machine = sim.machines[0]
    sent = sorted((s for s in sim.summaries if s.machine_id == machine), key=lambda s: s.window_end)
    with reading(sim.path) as store:
        series = store.telemetry_series(machine, points=50)
        two = store.telemetry_series(machine, sensors=["flow", "rpm"], points=50)
        every = store.telemetry_series(machine, points=5000)
    assert len(series) == 7 and all(0 < len(points) <= 51 for points in series.values())
    assert set(two) == {"flow", "rpm"}
    for points in series.values():
        for p in points:
            assert p["min"] <= p["mean"] <= p["max"] and p["min"] <= p["last"] <= p["max"]
    # Merged into 50 points, a sensor still holds every reading, its extremes and its latest value.
    flow = [s.sensors["flow"] for s in sent if "flow" in s.sensors]
    assert sum(p["samples"] for p in series["flow"]) == sum(f.count for f in flow)
    assert min(p["min"] for p in series["flow"]) == min(f.min for f in flow)
    assert max(p["max"] for p in series["flow"]) == max(f.max for f in flow)
    assert series["flow"][-1]["last"] == flow[-1].last
    # Unmerged, each point is what the edge sent.
    assert [(p["t"], p["mean"], p["last"]) for p in every["flow"]] == [
        (s.window_end, s.sensors["flow"].mean, s.sensors["flow"].last) for s in sent if "flow" in s.sensors
    ]


def test_a_young_store_without_the_newer_tables_answers_with_empty_lists(new_store: NewStore) -> None:
    path = new_store("old")
    sim = fill_store(path, machines=3, days=2, with_alerts=False, with_latest=False)
    with connect(path) as con:
        for table in ("alerts", "heartbeats", "telemetry_summaries", "latest_predictions", "model_metrics"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
    with reading(path) as store:
        machine = sim.machines[0]
        assert store.alerts().rows == [] and store.alerts().total == 0
        assert store.telemetry_series(machine) == {}
        assert all(r["open_alerts"] == [] for r in store.at_risk(limit=10).rows)
        assert all(e["heartbeat"] is None for e in store.rollout())
        assert store.fleet_summary()["open_alerts"] == 0
        assert store.at_risk(limit=10).total == 3


def test_an_empty_store_answers_with_empty_lists(new_store: NewStore) -> None:
    path = new_store("empty")
    with connect(path):  # a writer's first connection creates the schema
        pass
    with reading(path) as store:
        assert store.at_risk().rows == [] and store.at_risk().total == 0
        assert store.fleet_summary()["machines"] == 0
        assert store.rollout() == [] and store.quality() == [] and store.failures().rows == []
        assert store.machine_summary("m-1") is None and not store.machine_exists("m-1")


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM predictions",
        "INSERT INTO predictions SELECT * FROM predictions",
        "UPDATE predictions SET max_risk = 0",
        "DROP TABLE predictions",
        "CREATE TABLE x AS SELECT 1",
        "COPY predictions TO '/tmp/stolen.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "PRAGMA database_list",
        "SET threads = 1",
        "SELECT 1; DELETE FROM predictions",
        "INSTALL httpfs",
        "CHECKPOINT",
        "",
    ],
)
def test_sql_that_is_not_a_single_select_is_refused_and_nothing_changes(sim: SimulatedStore, statement: str) -> None:
    before = store_digest(sim.path)
    with reading(sim.path) as store, pytest.raises(SqlRejected) as err:
        store.sql(statement)
    assert str(err.value)
    assert store_digest(sim.path) == before


def test_sql_cannot_reach_files_or_run_forever(sim: SimulatedStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with reading(sim.path) as store:
        with pytest.raises(SqlRejected, match=r"disabled|Permission|does not exist"):
            store.sql(f"SELECT * FROM read_csv('{secret}')")
        with pytest.raises(SqlRejected, match="limit and was stopped"):
            store.sql("SELECT count(*) FROM range(100000000) a, range(100000000) b", timeout_s=0.3)
        with pytest.raises(SqlRejected, match=r"does not exist|Catalog"):
            store.sql("SELECT * FROM no_such_table")


def test_sql_returns_rows_and_says_when_it_cut_them(sim: SimulatedStore) -> None:
    with reading(sim.path) as store:
        counted = store.sql("WITH p AS (SELECT * FROM predictions) SELECT count(*) AS n FROM p")
        cut = store.sql("SELECT seq FROM predictions ORDER BY seq", limit=7)
    assert counted.columns == ["n"] and counted.rows == [[len(sim.predictions)]]
    assert cut.truncated and len(cut.rows) == 7


@pytest.mark.parametrize(
    ("text", "offset"),
    [("6h", timedelta(hours=6)), ("90m", timedelta(minutes=90)), ("2d", timedelta(days=2)), ("now", timedelta(0))],
)
def test_relative_time_bounds(text: str, offset: timedelta) -> None:
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert parse_time_bound(text, now=now) == now - offset


@pytest.mark.parametrize("text", ["yesterday", "6 hours", "-3h", "2026-13-01", ""])
def test_malformed_time_bounds_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="since="):
        parse_time_bound(text, name="since")


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="after until"):
        check_range(datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))


def test_quality_prefers_the_monitoring_pipelines_metrics_where_it_wrote_some(new_store: NewStore) -> None:
    path = new_store("monitored")
    fill_store(path, machines=3, days=2)
    now = datetime.now(UTC)
    rows = [
        {
            "model_name": "precursor-lm",
            "model_version": version,
            "kind": kind,
            "window_start": datetime(2026, 1, day, tzinfo=UTC),
            "window_end": datetime(2026, 1, day + 7, tzinfo=UTC),
            "examples": 100 * day,
            "tp": tp,
            "fp": 2,
            "fn": 3,
            "tn": 100 * day - tp - 5,
            "precision": tp / (tp + 2),
            "recall": tp / (tp + 3),
            "failures": 4,
            "failures_caught": 3,
            "mean_lead_time_h": 6.5,
            "threshold": 0.7,
            "computed_at": now,
        }
        for day, version, kind, tp in [(1, "0.1.0", "failure", 8), (2, "0.1.0", "failure", 9), (1, "0.1.0", "clog", 1)]
    ]
    PredictionStore(path).insert_table("model_metrics", pa.Table.from_pylist(rows))
    with reading(path) as store:
        any_failure = store.quality()
        clog = store.quality(kind="clog")
    assert {r["source"] for r in any_failure} == {"model_metrics"}
    assert [(r["windows"], r["tp"]) for r in any_failure] == [(100, 8), (200, 9)]
    assert [r["tp"] for r in clog] == [1]
