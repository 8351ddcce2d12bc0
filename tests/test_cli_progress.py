"""``precursor train`` and ``precursor evaluate`` show progress on stderr, and only there: stdout is the same with it.

The reproduction: training, evaluation and the first set-up ran for minutes with nothing on the screen.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from models.training.progress import wanted
from models.training.train import available_threads
from precursor.models_cli import evaluate_command, train_command
from tests.test_lm_training import write_tiny_fleet

SMALL = ["--until", "2026-01-12", "--max-steps", "10", "--n-layer", "1", "--n-embd", "16", "--n-head", "2"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_for_a_terminal_unless_forced_and_never_when_quiet() -> None:
    assert wanted(quiet=False, force=False, stream=_Terminal())
    assert not wanted(quiet=False, force=False, stream=io.StringIO())  # a pipe, a file, a CI log
    assert wanted(quiet=False, force=True, stream=io.StringIO())
    assert not wanted(quiet=True, force=True, stream=_Terminal())


def test_progress_goes_to_stderr_and_stdout_stays_the_same(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("train")(train_command)
    app.command("evaluate")(evaluate_command)
    data = write_tiny_fleet(tmp_path / "data", machines=5, hours=360, seed=5)
    common = ["--telemetry", str(data["telemetry"]), "--events", str(data["events"]), "--horizon", "12h"]
    runner = CliRunner()  # its stderr is no terminal: bars only when forced

    plain = runner.invoke(app, ["train", *common, *SMALL, "--out", str(tmp_path / "plain")])
    shown = runner.invoke(app, ["train", *common, *SMALL, "--out", str(tmp_path / "shown"), "--progress"])
    assert plain.exit_code == 0, plain.output
    assert shown.exit_code == 0, shown.output

    def comparable(stdout: str, out: str) -> str:
        return re.sub(r"trained [\d.]+ s", "trained … s", stdout).replace(str(tmp_path / out), "OUT")

    assert "validation PR-AUC" in plain.stdout
    assert comparable(shown.stdout, "shown") == comparable(plain.stdout, "plain")
    for stage in ("reading the fleet", "cutting windows", "training (steps)", "10/10", "choosing the alert threshold"):
        assert stage in shown.stderr, shown.stderr
    assert "reading the fleet" not in plain.stderr
    # No --threads: the cores this process may use, at most 2, recorded with the other settings.
    recorded = json.loads((tmp_path / "plain" / "precursor.json").read_text())["training"]
    assert recorded["threads"] == available_threads() == min(2, len(os.sched_getaffinity(0)))
    # No --scaling: each machine by its own statistics, unless machines are held out for test (new to the model:
    # one scaling for the fleet).
    assert recorded["tokenizer"]["scaling"] == "machine"
    (tmp_path / "held.txt").write_text("m-04\n")
    briefly = ["--max-steps", "1", "--set", "teacher_weight=0"]  # only the settings are read
    held = ["--test-machines", str(tmp_path / "held.txt"), "--out", str(tmp_path / "held")]
    trained = runner.invoke(app, ["train", *common, *SMALL, *briefly, *held])
    assert trained.exit_code == 0, trained.output
    assert json.loads((tmp_path / "held" / "precursor.json").read_text())["training"]["tokenizer"]["scaling"] == "fleet"

    model = ["--model", str(tmp_path / "plain"), "--json"]
    evaluated = runner.invoke(app, ["evaluate", *common, *model])
    evaluated_shown = runner.invoke(app, ["evaluate", *common, *model, "--progress"])
    evaluated_quiet = runner.invoke(app, ["evaluate", *common, *model, "--progress", "--quiet"])
    assert evaluated.exit_code == evaluated_shown.exit_code == evaluated_quiet.exit_code == 0, evaluated.output
    assert evaluated_shown.stdout == evaluated.stdout == evaluated_quiet.stdout
    assert "scoring" in evaluated_shown.stderr and "baseline gradient-boosting" in evaluated_shown.stderr
    assert "scoring" not in evaluated_quiet.stderr and "scoring" not in evaluated.stderr


def test_available_threads_are_the_cores_this_process_may_use_up_to_a_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert available_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert available_threads() == 2
    assert available_threads(most=4) == 4
