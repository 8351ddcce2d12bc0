"""``precursor query`` against a store filled from the simulator: every question, every output format, bad input."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from precursor.query_cli import query_app
from tests.fixtures_api import SimulatedStore, fill_store
from tests.fixtures_store import store_digest

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]

runner = CliRunner()


@pytest.fixture(scope="module")
def sim(new_store: NewStore) -> SimulatedStore:
    return fill_store(new_store("cli"))


def run(sim: SimulatedStore, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(query_app, [*args, "--store", str(sim.path)])
    return result.exit_code, result.stdout, result.stderr


def test_at_risk_as_json_lists_the_riskiest_latest_predictions(sim: SimulatedStore) -> None:
    code, out, _ = run(sim, "at-risk", "-n", "4", "--json")
    assert code == 0
    rows = json.loads(out)
    latest = sorted(sim.latest().values(), key=lambda p: (-p.max_risk, p.machine_id))[:4]
    assert [(r["machine_id"], r["max_risk"]) for r in rows] == [(p.machine_id, p.max_risk) for p in latest]
    assert {"elevated_since", "open_alerts", "risk"} <= set(rows[0])


def test_at_risk_as_a_table_and_as_csv(sim: SimulatedStore) -> None:
    code, table, _ = run(sim, "at-risk", "-n", "3")
    assert code == 0 and "Machines most at risk (1-3 of" in table
    riskiest = max(sim.latest().values(), key=lambda p: (p.max_risk, p.machine_id))
    assert riskiest.machine_id in table
    code, text, _ = run(sim, "at-risk", "-n", "100", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert code == 0 and len(rows) == len(sim.latest())
    assert json.loads(rows[0]["risk"]) == sim.latest()[rows[0]["machine_id"]].risk


def test_machine_shows_failures_with_lead_times_and_predictions(sim: SimulatedStore) -> None:
    machine = next(m for m in sim.machines if sim.failures(m))
    code, out, _ = run(sim, "machine", machine, "-n", "5", "--json")
    assert code == 0
    answer = json.loads(out)
    assert answer["total"] == len(sim.of(machine)) and len(answer["predictions"]) == 5
    assert sorted(f["failed_at"] for f in answer["failures"]) == sorted(
        f.timestamp.isoformat() for f in sim.failures(machine)
    )
    assert all("lead_time_h" in f for f in answer["failures"])
    code, table, _ = run(sim, "machine", machine)
    assert code == 0 and f"Failures of {machine}" in table and f"Predictions of {machine}" in table


@pytest.mark.parametrize(
    ("args", "rows_of"),
    [
        (["alerts", "-n", "1000"], lambda s: len(s.alerts)),
        (["alerts", "-n", "1000", "--state", "raised"], lambda s: sum(a["state"] == "raised" for a in s.alerts)),
        (["failures", "-n", "1000"], lambda s: len(s.failures())),
        (["versions"], lambda s: len({(p.edge_id, p.model_version) for p in s.predictions})),
        (["rollout"], lambda s: len({p.edge_id for p in s.predictions})),
        (["edges"], lambda s: len({p.edge_id for p in s.predictions})),
    ],
)
def test_each_question_answers_in_json(sim: SimulatedStore, args: list[str], rows_of) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(sim, *args, "--json")
    assert code == 0
    assert len(json.loads(out)) == rows_of(sim)


def test_events_and_quality(sim: SimulatedStore) -> None:
    machine = sim.machines[1]
    code, out, _ = run(sim, "events", machine, "--kind", "error", "-n", "1000", "--json")
    assert code == 0
    assert len(json.loads(out)) == sum(1 for e in sim.events if e.machine_id == machine and e.kind == "error")
    code, out, _ = run(sim, "quality", "--bucket", "2d", "--json")
    assert code == 0
    rows = json.loads(out)
    assert rows and {r["source"] for r in rows} == {"computed"}


def test_sql_reads_and_refuses_to_write(sim: SimulatedStore) -> None:
    before = store_digest(sim.path)
    code, out, _ = run(sim, "sql", "SELECT count(*) AS n FROM predictions", "--json")
    assert code == 0 and json.loads(out) == [{"n": len(sim.predictions)}]
    code, _, err = run(sim, "sql", "DELETE FROM predictions")
    assert code == 2 and "only a single SELECT" in err and "DELETE" in err
    code, _, err = run(sim, "sql", "SELECT 1; DROP TABLE events")
    assert code == 2 and "single statement" in err
    assert store_digest(sim.path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["at-risk", "--since", "last week"], "--since 'last week'"),
        (["machine", "m-001", "--until", "soonish"], "--until='soonish'"),
        (["machine", "no-such-machine"], "unknown machine 'no-such-machine'"),
        (["events", "no-such-machine"], "unknown machine 'no-such-machine'"),
        (["alerts", "--state", "open"], "--state 'open'"),
        (["quality", "--bucket", "fortnight"], "--bucket"),
        (["machine", "m-001", "--since", "2026-02-01", "--until", "2026-01-01"], "after until"),
    ],
)
def test_bad_input_is_a_clear_error(sim: SimulatedStore, args: list[str], message: str) -> None:
    code, _, err = run(sim, *args)
    assert code == 2
    assert message in err


def test_a_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(query_app, ["at-risk", "--store", str(tmp_path / "nothing.duckdb")])
    assert result.exit_code == 2 and "no prediction store" in result.stderr
