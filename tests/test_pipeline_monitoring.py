"""Monitoring: quality per model version over sliding event-time windows, and drift, from the store."""

from __future__ import annotations

from pathlib import Path

from pipelines.drift import DriftReference, histogram
from pipelines.labeling import run_labeling
from pipelines.monitoring import run_monitoring
from pipelines.settings import PipelineSettings
from precursor.contracts.messages import Prediction
from precursor.store import connect
from tests.test_pipeline_labeling import FleetHistory, store_history

DAY = 24
SETTINGS = PipelineSettings(allowed_lateness="0s", monitoring_window="10d", monitoring_every="10d")
# 10-day windows lie on a grid from the epoch: with the history from 2026-03-01 (hour 0) they start on Feb 26, Mar 8,
# Mar 18, Mar 28 and Apr 7, i.e. at hours -72, 168, 408, 648 and 888. Two bearing failures fall in each of the first
# two windows, two failures of a kind the model never learned (seal) in each of the next two, each failure with its
# day of warning windows inside the same monitoring window.
BEARINGS = [
    ("pump-00", 77, "failure:bearing"),
    ("pump-01", 130, "failure:bearing"),
    ("pump-02", 250, "failure:bearing"),
    ("pump-03", 330, "failure:bearing"),
]
SEALS = [
    ("pump-00", 500, "failure:seal"),
    ("pump-01", 560, "failure:seal"),
    ("pump-02", 720, "failure:seal"),
    ("pump-03", 800, "failure:seal"),
]


def risk_before_bearings(machine: str, hour: float) -> dict[str, float]:
    """A model that sees bearing failures coming 20 h ahead and is blind to everything else."""
    warned = any(m == machine and 0 < at - hour <= 20 for m, at, _ in BEARINGS)
    return {"failure": 0.9, "bearing": 0.85} if warned else {"failure": 0.1, "bearing": 0.05}


def test_recall_drops_when_a_new_failure_kind_appears(tmp_path: Path) -> None:
    history = FleetHistory(machines=6, hours=40 * DAY, failures=BEARINGS + SEALS)
    store = store_history(tmp_path / "store.duckdb", history.messages(risk_before_bearings))
    run_labeling(store, tmp_path / "dataset", settings=SETTINGS)

    report = run_monitoring(store, tmp_path / "dataset", settings=SETTINGS)

    windows = report.series("failure")
    assert [w.window_start.strftime("%m-%d") for w in windows] == ["02-26", "03-08", "03-18", "03-28", "04-07"]
    early, late, last = windows[:2], windows[2:4], windows[4]
    # Each failure has 24 windows whose horizon holds it; the model warned in the 20 before it.
    assert all(w.recall == 20 / 24 and w.precision == 1.0 for w in early)
    assert all(w.failures == w.failures_caught == 2 and w.mean_lead_time_h == 20.0 for w in early)
    assert all(w.recall == 0.0 and w.failures == 2 and w.failures_caught == 0 for w in late)
    assert last.failures == 0 and last.recall is None
    seal = report.series("seal")
    assert [w.window_start.strftime("%m-%d") for w in seal] == ["03-18", "03-28"]
    assert all(w.recall == 0.0 and w.tp == 0 and w.fn == 48 for w in seal)
    with connect(store, read_only=True) as con:
        stored = con.execute(
            "SELECT window_start::DATE::VARCHAR, recall FROM model_metrics WHERE kind = 'failure' ORDER BY 1"
        ).fetchall()
    assert [(day, r) for day, r in stored] == [(w.window_start.date().isoformat(), w.recall) for w in windows]


def test_new_error_codes_in_the_event_stream_are_a_drift_event_and_a_rerun_replaces_rows(tmp_path: Path) -> None:
    usual = [(f"pump-0{m}", h, "error:E1") for m in range(3) for h in range(5, 480, 30)]
    novel = [(f"pump-0{m}", h, "error:E9") for m in range(3) for h in range(485, 960, 30)]
    history = FleetHistory(machines=3, hours=40 * DAY, failures=usual + novel)
    store = store_history(tmp_path / "store.duckdb", history.messages(lambda m, h: {"failure": 0.1}))
    reference = DriftReference(features={"events": histogram(["error:E1"] * 999 + ["error:E2"])})

    settings = SETTINGS.model_copy(update={"drift_min_observations": 10})
    report = run_monitoring(store, tmp_path / "dataset", settings=settings, reference=reference)

    events = sorted((d for d in report.drift if d.feature == "events"), key=lambda d: d.window_start)
    # Windows from hour -72, 168, 408, 648, 888: E9 starts at hour 485, inside the third. The last window holds only
    # the 6 events of hours 888 to 960: as far off as the others, but too few to call.
    assert [d.drifted for d in events] == [False, False, True, True, False]
    assert events[0].psi < 0.01 and events[-1].psi > 5 and events[-1].observations == 6
    assert [d.feature for d in report.drift_events] == ["events"] * 2
    steady_risk = [d for d in report.drift if d.feature == "max_risk"]
    assert steady_risk and all(d.psi < 1e-9 and not d.drifted for d in steady_risk)

    again = run_monitoring(store, tmp_path / "dataset", settings=settings, reference=reference)
    assert again.drift == report.drift
    with connect(store, read_only=True) as con:
        drifted = con.execute("SELECT count(*) FROM drift WHERE drifted").fetchone()
    assert drifted == (2,)


def test_each_model_version_is_judged_at_its_own_threshold(tmp_path: Path) -> None:
    history = FleetHistory(machines=6, hours=20 * DAY, failures=BEARINGS)
    # The same risks as above, from a model whose own threshold (0.95) is above its warnings (0.9): by its own
    # standard it never warned. Predictions without a threshold are judged at the configured one (0.5 here).
    strict = [
        m.model_copy(update={"threshold": 0.95}) if isinstance(m, Prediction) else m
        for m in history.messages(risk_before_bearings)
    ]
    store = store_history(tmp_path / "store.duckdb", strict)
    run_labeling(store, tmp_path / "dataset", settings=SETTINGS)

    report = run_monitoring(store, tmp_path / "dataset", settings=SETTINGS)

    early = report.series("failure")[:2]
    assert all(w.threshold == 0.95 and w.recall == 0.0 and w.failures_caught == 0 for w in early)
    assert SETTINGS.threshold < 0.9  # at the configured threshold these warnings would have counted


def test_a_store_made_before_thresholds_gains_the_column(tmp_path: Path) -> None:
    import duckdb

    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE predictions (edge_id VARCHAR NOT NULL, seq BIGINT NOT NULL, machine_id VARCHAR NOT NULL, "
            "window_start TIMESTAMPTZ NOT NULL, window_end TIMESTAMPTZ NOT NULL, horizon_h DOUBLE NOT NULL, "
            "risk JSON NOT NULL, max_risk DOUBLE NOT NULL, top_kind VARCHAR NOT NULL, model_name VARCHAR NOT NULL, "
            "model_version VARCHAR NOT NULL, emitted_at TIMESTAMPTZ NOT NULL, ingested_at TIMESTAMPTZ NOT NULL, "
            "PRIMARY KEY (edge_id, seq))"
        )
    history = FleetHistory(machines=1, hours=3)
    store_history(
        path, [m.model_copy(update={"threshold": 0.3}) for m in history.messages(lambda m, h: {"failure": 0.1})]
    )
    with connect(path, read_only=True) as con:
        assert con.execute("SELECT count(*), min(threshold), max(threshold) FROM predictions").fetchone() == (
            3,
            0.3,
            0.3,
        )
