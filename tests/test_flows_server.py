"""The local Prefect server: started in the background, found again by pid, stopped only if it is ours."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.prefect_server import LocalPrefectServer, PrefectServerError, api_healthy
from infra.processes import free_ports
from precursor.flows_cli import flows_app

pytest_plugins = ["tests.fixtures_prefect"]
pytestmark = pytest.mark.integration


def test_a_second_handle_on_the_same_folder_sees_the_running_server(prefect_server: LocalPrefectServer) -> None:
    assert api_healthy(prefect_server.api_url)
    other = LocalPrefectServer(state_dir=prefect_server.state_dir, port=prefect_server.port)
    status = other.status()
    assert status.running and status.healthy
    assert status.pid == int(prefect_server.pid_file.read_text())
    # `up` on a running server is a no-op: same pid, still healthy.
    assert other.up(timeout_s=10).pid == status.pid


def test_status_reports_the_port_the_server_was_started_with(prefect_server: LocalPrefectServer) -> None:
    elsewhere = LocalPrefectServer(state_dir=prefect_server.state_dir, port=prefect_server.port + 1)
    assert elsewhere.status().api_url == prefect_server.api_url
    with pytest.raises(PrefectServerError, match="already runs at"):
        elsewhere.up(timeout_s=5)


def test_cli_status_prints_json_and_exits_1_when_nothing_runs(
    prefect_server: LocalPrefectServer, tmp_path: Path
) -> None:
    runner = CliRunner()
    running = runner.invoke(
        flows_app, ["server", "status", "--json", "--state-dir", str(prefect_server.state_dir)], catch_exceptions=False
    )
    assert running.exit_code == 0
    assert json.loads(running.stdout)["healthy"] is True
    idle = runner.invoke(flows_app, ["server", "status", "--state-dir", str(tmp_path)], catch_exceptions=False)
    assert idle.exit_code == 1
    assert "running  no" in idle.stdout


def test_a_busy_port_is_refused_with_its_number(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(PrefectServerError, match=f"port={port} on 127.0.0.1 is in use"):
            LocalPrefectServer(state_dir=tmp_path, port=port).up(timeout_s=5)


def test_down_leaves_a_process_that_is_not_ours_alone(tmp_path: Path) -> None:
    server = LocalPrefectServer(state_dir=tmp_path, port=free_ports(1)[0])
    server.home.mkdir(parents=True)
    server.pid_file.write_text("1\n")  # pid 1 is alive, and certainly not our Prefect server
    assert server.down() is False
    assert not server.pid_file.exists()


def test_down_stops_the_server_and_up_brings_it_back(prefect_server: LocalPrefectServer) -> None:
    pid = prefect_server.status().pid
    assert prefect_server.down(timeout_s=30) is True
    assert not api_healthy(prefect_server.api_url, timeout_s=1)
    assert not Path(f"/proc/{pid}").exists() or prefect_server.status().running is False
    restarted = prefect_server.up(timeout_s=180)
    assert restarted.healthy and restarted.pid != pid
