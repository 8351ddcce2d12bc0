"""Everything kept at run time follows ``PRECURSOR_STATE_DIR``: the flows' paths and the edge agent's state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import EdgeConfig
from flows.settings import DriftCheckSettings, RetrainSettings
from precursor.pipeline_cli import dataset_path
from tests.conftest import REPO_ROOT

EDGE = {"edge_id": "edge-s", "sources": [{"type": "replay", "telemetry": "telemetry.csv"}]}


def paths_of(settings: RetrainSettings | DriftCheckSettings) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name, value in settings:
        if isinstance(value, Path):
            found[name] = value
        elif isinstance(value, list):
            found.update({f"{name}[{i}]": v for i, v in enumerate(value) if isinstance(v, Path)})
    return found


def test_every_default_path_follows_the_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRECURSOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("PRECURSOR_STORE", raising=False)
    drift = DriftCheckSettings()
    paths = {**paths_of(drift.retrain), "store": drift.store}
    assert {"labeled_dataset", "telemetry", "work_dir", "registry", "signing_key", "trusted_keys[0]"} <= set(paths)
    outside = {name: p for name, p in paths.items() if not p.is_relative_to(tmp_path / "state")}
    assert outside == {}
    assert RetrainSettings().registry == tmp_path / "state" / "registry"


def test_the_flow_reads_labeled_examples_where_the_pipeline_writes_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PRECURSOR_STATE_DIR", str(tmp_path))
    assert RetrainSettings().labeled_dataset == dataset_path(None)


def test_the_edge_keeps_its_state_in_the_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECURSOR_STATE_DIR", "deployment")
    config = EdgeConfig.from_dict(EDGE, base=tmp_path / "etc")
    assert config.state_dir == tmp_path / "deployment" / "edge"


def test_without_a_state_dir_the_edge_keeps_its_state_beside_its_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PRECURSOR_STATE_DIR", raising=False)
    assert EdgeConfig.from_dict(EDGE, base=tmp_path).state_dir == tmp_path / ".state" / "edge"
    given = EdgeConfig.from_dict({**EDGE, "state_dir": "mine"}, base=tmp_path)
    assert given.state_dir == tmp_path / "mine"


def test_a_flow_run_in_a_state_dir_not_made_yet_starts_cleanly(tmp_path: Path) -> None:
    """The reproduction: Prefect could not make ``<state>/prefect`` two levels deep, so the temporary server it starts
    when no server runs could not open its database; the run retried for minutes, with a traceback each time."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    env["PRECURSOR_STATE_DIR"] = str(tmp_path / "fresh" / "state")
    done = subprocess.run(
        [sys.executable, "-m", "precursor", "flows", "run", "drift-check"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "no retrain: no monitoring figures yet" in done.stdout
    assert "Traceback" not in output and "unable to open database file" not in output, output[-3000:]
    assert (tmp_path / "fresh" / "state" / "prefect").is_dir()
