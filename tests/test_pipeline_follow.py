"""``pipeline run --follow`` outlives a failed run: a broker or task manager that dies under a run fails that run, and
the loop reads the same records again from the store's offsets instead of stopping the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.engines import EngineError
from pipelines.run import RunReport, follow
from precursor.contracts.settings import KafkaSettings


class FlakyRuns:
    """A stand-in for ``run_once``: each call takes the next outcome, an exception to raise or a report."""

    def __init__(self, outcomes: list[RunReport | Exception]) -> None:
        self.outcomes = outcomes
        self.calls = 0

    def __call__(self, settings: KafkaSettings, store_path: str | Path, **kwargs: object) -> RunReport:
        outcome = self.outcomes[self.calls]
        self.calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_a_failed_run_is_retried_and_the_loop_goes_on(tmp_path: Path) -> None:
    runs = FlakyRuns(
        [
            RunReport(read=3, stored=3),
            RuntimeError("job failed: TaskManager lost"),
            RuntimeError("NotEnoughReplicas"),
            RunReport(read=7, stored=5, already_stored=2),
            RunReport(),
        ]
    )
    failures: list[tuple[str, int]] = []
    total = follow(
        KafkaSettings(),
        tmp_path / "store.duckdb",
        poll_s=0.001,
        max_runs=5,
        run=runs,
        on_failure=lambda err, in_a_row: failures.append((str(err), in_a_row)),
    )
    assert runs.calls == 5
    assert failures == [("job failed: TaskManager lost", 1), ("NotEnoughReplicas", 2)]
    assert (total.read, total.stored, total.already_stored) == (10, 8, 2)


def test_a_run_that_cannot_work_as_configured_ends_the_loop(tmp_path: Path) -> None:
    runs = FlakyRuns([EngineError("no Flink job server: install it"), RunReport(read=1)])
    with pytest.raises(EngineError, match="install it"):
        follow(KafkaSettings(), tmp_path / "store.duckdb", poll_s=0.001, max_runs=2, run=runs)
    assert runs.calls == 1
