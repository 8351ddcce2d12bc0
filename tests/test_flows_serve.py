"""``precursor flows serve``: a scheduled retrain runs by itself against the Prefect server, on a short cron."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
)
from prefect.client.schemas.objects import FlowRun
from typer.testing import CliRunner

from flows.retrain import COMPARISON_ARTIFACT_KEY
from flows.serve import RETRAIN_DEPLOYMENT
from flows.settings import RetrainSettings
from infra.prefect_server import LocalPrefectServer
from precursor.flows_cli import flows_app

if TYPE_CHECKING:
    from tests.fixtures_flows import History

pytest_plugins = ["tests.fixtures_prefect", "tests.fixtures_flows"]

EVERY_15_S = "* * * * * */15"
"""Six fields, seconds last: the shortest schedule a test can wait for."""


def test_serve_refuses_a_cron_it_cannot_read_and_names_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))  # the command sets it when unset
    result = CliRunner().invoke(flows_app, ["serve", "--retrain-cron", "at noon"])
    assert result.exit_code == 2
    assert "--retrain-cron='at noon' is not a valid cron string" in result.output


@pytest.fixture
def serving(flows_history: History, tmp_path: Path, prefect_server: LocalPrefectServer) -> Iterator[RetrainSettings]:
    """``precursor flows serve`` in its own process group, configured by the
    environment as a deployment would be; yields the settings its retrains run with."""
    settings = flows_history.retrain_settings(
        tmp_path, training=flows_history.training.model_copy(update={"max_steps": 60})
    )
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server.api_url,
        "PRECURSOR_RETRAIN_LABELED_DATASET": str(settings.labeled_dataset),
        "PRECURSOR_RETRAIN_TELEMETRY": str(settings.telemetry),
        "PRECURSOR_RETRAIN_EVENTS": str(settings.events),
        "PRECURSOR_RETRAIN_MACHINES": str(settings.machines),
        "PRECURSOR_RETRAIN_WORK_DIR": str(settings.work_dir),
        "PRECURSOR_RETRAIN_REGISTRY": str(settings.registry),
        "PRECURSOR_RETRAIN_SIGNING_KEY": str(settings.signing_key),
        "PRECURSOR_RETRAIN_TRUSTED_KEYS": f'["{settings.trusted_keys[0]}"]',
        "PRECURSOR_RETRAIN_HORIZON_H": str(settings.horizon_h),
        "PRECURSOR_RETRAIN_HOLDOUT_H": str(settings.holdout_h),
        "PRECURSOR_RETRAIN_TRAINING": settings.training.model_dump_json(),
        "PRECURSOR_RETRAIN_PUBLISH": "false",
    }
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from precursor.flows_cli import flows_app; flows_app(prog_name='precursor flows')",
            "serve",
            "--retrain-cron",
            EVERY_15_S,
            "--no-drift-check",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its flow runs are its children: one signal to the group stops them all
    )
    try:
        yield settings
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        # The server keeps a served deployment's schedule after serve stops: without this, it goes on making a run
        # every 15 s for the rest of the session, under every later test that lists retrain runs.
        with get_client(sync_client=True) as client:
            for deployment in client.read_deployments(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[RETRAIN_DEPLOYMENT]))
            ):
                client.delete_deployment(deployment.id)


def scheduled_runs() -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        deployments = client.read_deployments(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[RETRAIN_DEPLOYMENT]))
        )
        if not deployments:
            return []
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[d.id for d in deployments]))
        )


@pytest.mark.integration
def test_a_scheduled_retrain_runs_by_itself_under_serve(serving: RetrainSettings, tmp_path: Path) -> None:
    deadline = time.monotonic() + 240
    finished: list[FlowRun] = []
    while time.monotonic() < deadline and not finished:
        finished = [r for r in scheduled_runs() if r.state is not None and r.state.is_final()]
        time.sleep(2)
    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert finished, f"no scheduled retrain finished in time; serve said:\n{log[-3000:]}"
    run = finished[0]
    assert run.auto_scheduled  # the scheduler made it, nobody asked
    assert run.state is not None and run.state.is_completed(), f"{run.state}\n{log[-3000:]}"
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    assert [a.key for a in artifacts] == [COMPARISON_ARTIFACT_KEY]
    # A real retrain: the run trained a candidate checkpoint in its own folder.
    assert list(serving.work_dir.glob("*/checkpoint/precursor.json"))
