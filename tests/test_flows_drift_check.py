"""The drift check reads the monitoring figures from the store and retrains only when a threshold is crossed."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from flows.drift_check import drift_check, trigger_reason
from flows.monitoring import QualityReading, read_quality
from flows.settings import DriftCheckSettings
from infra.prefect_server import LocalPrefectServer
from pipelines.monitoring import DriftMeasure, WindowMetrics
from precursor.flows_cli import flows_app
from precursor.store import PredictionStore, connect

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_prefect", "tests.fixtures_postgres"]

DAY = timedelta(days=1)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def metric(version: str, start_day: int, *, examples: int, recall: float | None, failures: int) -> WindowMetrics:
    return WindowMetrics(
        model_name="precursor-lm",
        model_version=version,
        kind="failure",
        window_start=T0 + start_day * DAY,
        window_end=T0 + (start_day + 7) * DAY,
        examples=examples,
        tp=1,
        fp=1,
        fn=1,
        tn=examples - 3,
        precision=0.5,
        recall=recall,
        failures=failures,
        failures_caught=1,
        mean_lead_time_h=4.0,
        threshold=0.5,
    )


def write_store(path: Path | str, metrics: list[WindowMetrics], drift: list[DriftMeasure]) -> None:
    now = datetime.now(UTC)
    store = PredictionStore(path)
    store.insert_table("model_metrics", pa.Table.from_pylist([asdict(m) | {"computed_at": now} for m in metrics]))
    if drift:
        store.insert_table("drift", pa.Table.from_pylist([asdict(d) | {"computed_at": now} for d in drift]))


def drift(version: str, start_day: int, psi: float, feature: str = "events") -> DriftMeasure:
    return DriftMeasure(
        model_name="precursor-lm" if version != "*" else "*",
        model_version=version,
        feature=feature,
        window_start=T0 + start_day * DAY,
        window_end=T0 + (start_day + 7) * DAY,
        psi=psi,
        observations=100,
        drifted=psi >= 0.25,
    )


def test_the_newest_full_window_of_the_newest_version_is_read(new_store: NewStore) -> None:
    store = new_store("quality")
    write_store(
        store,
        [
            metric("1", 0, examples=500, recall=0.8, failures=6),
            metric("2", 3, examples=400, recall=0.3, failures=5),  # full: data ends on day 10
            metric("2", 4, examples=300, recall=0.9, failures=1),  # reaches past the data: fewer examples
            metric("2", 0, examples=100, recall=0.5, failures=2),  # older than one window length
        ],
        [drift("2", 3, 0.1, "max_risk"), drift("*", 3, 0.6), drift("2", 4, 0.9)],
    )
    reading = read_quality(store)
    assert reading is not None
    assert (reading.model_version, reading.recall, reading.failures) == ("2", 0.3, 5)
    assert reading.window_start == T0 + 3 * DAY
    assert (reading.drift, reading.drift_feature) == (0.6, "events")  # the fleet's input drift in the same window


def test_no_store_or_no_figures_yet_reads_as_none(new_store: NewStore) -> None:
    assert read_quality(new_store("absent")) is None  # no file; a database without the tables
    empty = new_store("empty")
    with connect(empty):
        pass  # the schema, with no rows yet
    assert not isinstance(empty, Path) or empty.is_file()
    assert read_quality(empty) is None


def test_recall_triggers_only_over_enough_failures_and_drift_names_its_feature() -> None:
    settings = DriftCheckSettings(min_recall=0.5, max_drift=0.25, min_failures=3)
    low = QualityReading(model_version="2", recall=0.2, failures=2, drift=0.1)
    assert trigger_reason(low, settings) is None
    drifted = low.model_copy(update={"drift": 0.4, "drift_feature": "events"})
    assert trigger_reason(drifted, settings) == "drift of events (PSI 0.400) is above max_drift 0.250"
    both = drifted.model_copy(update={"failures": 3})
    assert trigger_reason(both, settings) == (
        "recall 0.200 of model 2 over 3 failures is below min_recall 0.500; "
        "drift of events (PSI 0.400) is above max_drift 0.250"
    )


@pytest.mark.integration
def test_a_healthy_model_is_left_alone_by_the_flow(tmp_path: Path, prefect_server: LocalPrefectServer) -> None:
    store = tmp_path / "store.duckdb"
    write_store(store, [metric("2", 0, examples=400, recall=0.9, failures=6)], [drift("2", 0, 0.05)])
    # The retrain settings point nowhere: a retrain would fail, so the check passing proves none started.
    report = drift_check(DriftCheckSettings(store=store, retrain={"labeled_dataset": tmp_path / "nowhere"}))
    assert not report.triggered and report.retrain is None
    assert report.reading is not None and report.reading.recall == 0.9
    assert "within thresholds" in report.reason


@pytest.mark.integration
def test_cli_drift_check_says_there_is_nothing_to_judge_yet(
    tmp_path: Path, prefect_server: LocalPrefectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))  # the command sets it when unset
    monkeypatch.setenv("PRECURSOR_DRIFT_STORE", str(tmp_path / "absent.duckdb"))
    result = CliRunner().invoke(flows_app, ["run", "drift-check"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "no retrain: no monitoring figures yet" in result.output


def test_cli_names_a_bad_setting_and_its_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setenv("PRECURSOR_DRIFT_MIN_RECALL", "1.5")
    result = CliRunner().invoke(flows_app, ["run", "drift-check"])
    assert result.exit_code == 2
    assert "min_recall='1.5': Input should be less than or equal to 1" in result.output
