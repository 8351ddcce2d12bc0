"""Labeling: predictions joined with the failures reported later, into a Parquet training dataset."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from pipelines.labeling import day_file, read_dataset, run_labeling
from pipelines.settings import PipelineSettings
from precursor.contracts.messages import EdgeEvent, Prediction
from tests.fixtures_store import store_messages

T0 = datetime(2026, 3, 1, tzinfo=UTC)
NO_LATENESS = PipelineSettings(allowed_lateness="0s")

RiskOf = Callable[[str, float], dict[str, float]]


@dataclass
class FleetHistory:
    """A synthetic history: hourly predictions per machine, failures at given hours, and the edge that sent them."""

    machines: int
    hours: int
    failures: list[tuple[str, float, str]] = field(default_factory=list)  # (machine, hour, event text)
    horizon_h: float = 24.0
    model_version: str = "1"
    edges: int = 2

    def machine_ids(self) -> list[str]:
        return [f"pump-{m:02d}" for m in range(self.machines)]

    def edge_of(self, machine_id: str) -> str:
        return f"edge-{int(machine_id.split('-')[1]) % self.edges}"

    def messages(self, risk_of: RiskOf) -> list[Prediction | EdgeEvent]:
        """Every message in the order each edge would send it (time order), edges interleaved."""
        seqs = {f"edge-{e}": itertools.count() for e in range(self.edges)}
        timeline: list[tuple[float, int, Prediction | EdgeEvent]] = []
        for machine, hour, event in self.failures:
            timeline.append((hour, 0, self._event(machine, hour, event)))
        for m in self.machine_ids():
            for h in range(1, self.hours + 1):
                timeline.append((h, 1, self._prediction(m, h, risk_of(m, h))))
        timeline.sort(key=lambda item: (item[0], item[1], item[2].machine_id))
        out: list[Prediction | EdgeEvent] = []
        for _, _, message in timeline:
            out.append(message.model_copy(update={"seq": next(seqs[message.edge_id])}))
        return out

    def _prediction(self, machine_id: str, hour: float, risk: dict[str, float]) -> Prediction:
        end = T0 + timedelta(hours=hour)
        return Prediction(
            edge_id=self.edge_of(machine_id),
            seq=0,
            machine_id=machine_id,
            window_start=end - timedelta(hours=1),
            window_end=end,
            horizon_h=self.horizon_h,
            risk=risk,
            model_name="lm",
            model_version=self.model_version,
            emitted_at=end,
        )

    def _event(self, machine_id: str, hour: float, event: str) -> EdgeEvent:
        return EdgeEvent(
            edge_id=self.edge_of(machine_id),
            seq=0,
            machine_id=machine_id,
            timestamp=T0 + timedelta(hours=hour),
            event=event,
        )


def store_history(path: Path, messages: list[Prediction | EdgeEvent]) -> Path:
    store_messages(path, messages)
    return path


def steady(_machine: str, _hour: float) -> dict[str, float]:
    return {"failure": 0.1}


def test_each_prediction_gets_the_kind_of_the_first_failure_within_its_horizon(tmp_path: Path) -> None:
    history = FleetHistory(
        machines=2, hours=72, failures=[("pump-00", 30.5, "failure:bearing"), ("pump-00", 40, "failure:seal")]
    )
    # One more message from each edge at hour 100 moves every watermark past the 72 h of predictions' horizons.
    tail = [
        history._event(m, 100, "error:E1").model_copy(update={"seq": 10_000 + i})
        for i, m in enumerate(history.machine_ids())
    ]
    store = store_history(tmp_path / "store.duckdb", history.messages(steady) + tail)

    report = run_labeling(store, tmp_path / "dataset", settings=NO_LATENESS)

    rows = {(r["machine_id"], r["window_end"]): r for r in read_dataset(tmp_path / "dataset").to_pylist()}
    assert report.examples == len(rows) == 2 * 72 and report.pending == 0
    at = lambda h: T0 + timedelta(hours=h)  # noqa: E731
    # Window ending at 7 h: horizon [7 h, 31 h) holds the bearing failure at 30.5 h only.
    assert rows[("pump-00", at(7))]["outcome"] == "bearing"
    assert rows[("pump-00", at(7))]["failure_kinds"] == ["bearing"]
    assert rows[("pump-00", at(7))]["lead_time_h"] == 23.5
    # Window ending at 6 h: its horizon [6 h, 30 h) ends before the failure.
    assert rows[("pump-00", at(6))]["outcome"] == "ok" and rows[("pump-00", at(6))]["failure_at"] is None
    # Window ending at 20 h sees both failures; the first one is the outcome.
    assert rows[("pump-00", at(20))]["outcome"] == "bearing"
    assert rows[("pump-00", at(20))]["failure_kinds"] == ["bearing", "seal"]
    # After the bearing failure, only the seal failure is ahead.
    assert rows[("pump-00", at(31))]["outcome"] == "seal"
    assert rows[("pump-00", at(31))]["lead_time_h"] == 9.0
    assert all(r["outcome"] == "ok" for (m, _), r in rows.items() if m == "pump-01")
    assert report.outcomes == {"bearing": 24, "ok": 144 - 24 - 10, "seal": 10}
    assert report.days == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]


def test_an_outcome_still_open_at_the_watermark_stays_pending_until_a_later_run(tmp_path: Path) -> None:
    history = FleetHistory(machines=1, hours=48, edges=1)
    messages = history.messages(steady)
    store = store_history(tmp_path / "store.duckdb", messages)
    settings = PipelineSettings(allowed_lateness="2h")

    first = run_labeling(store, tmp_path / "dataset", settings=settings)
    # The edge's newest record is at 48 h, so its watermark is 46 h: horizons that end by then are decided.
    assert (first.examples, first.pending) == (22, 26)

    later = FleetHistory(machines=1, hours=80, edges=1).messages(steady)[48:]
    store_messages(store, later)
    second = run_labeling(store, tmp_path / "dataset", settings=settings)
    assert (second.examples, second.pending) == (54, 80 - 54)


def test_a_rerun_rewrites_nothing_and_a_new_failure_rewrites_only_the_days_it_changes(tmp_path: Path) -> None:
    history = FleetHistory(machines=2, hours=96)
    store = store_history(tmp_path / "store.duckdb", history.messages(steady))
    dataset = tmp_path / "dataset"

    first = run_labeling(store, dataset, settings=NO_LATENESS)
    assert first.days_rewritten == first.days == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]
    before = {day: day_file(dataset, day).stat().st_mtime_ns for day in first.days}
    again = run_labeling(store, dataset, settings=NO_LATENESS)
    assert again.days_rewritten == [] and again.examples == first.examples
    assert {day: day_file(dataset, day).stat().st_mtime_ns for day in first.days} == before

    # A failure reported late (within the predictions' 24 h horizon, day 2) changes day 1 and day 2 only.
    store_messages(store, [history._event("pump-01", 30, "failure:motor").model_copy(update={"seq": 9_999})])
    third = run_labeling(store, dataset, settings=NO_LATENESS)
    assert third.days_rewritten == ["2026-03-01", "2026-03-02"]
    assert third.outcomes["motor"] == 24
    day2 = pq.read_table(day_file(dataset, "2026-03-02")).to_pylist()
    assert {r["outcome"] for r in day2 if r["machine_id"] == "pump-01" and r["window_end"].hour < 6} == {"motor"}
