"""free_ports: ports for the services tests start, which no outgoing connection can take before the service binds."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from infra import processes
from infra.processes import ephemeral_port_range, free_ports, port_in_use


def test_ports_lie_below_the_kernels_ephemeral_range_and_are_free() -> None:
    low, high = ephemeral_port_range()
    for _ in range(20):
        ports = free_ports(4)
        assert len(set(ports)) == 4
        assert all(not low <= port <= high for port in ports), (ports, low, high)
        assert not any(port_in_use("127.0.0.1", port) for port in ports)


def test_a_consecutive_run_skips_a_port_something_listens_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        # a range file that leaves exactly the ports around the squatter: a run of 3 must avoid it
        fake = tmp_path / "range"
        fake.write_text(f"{taken + 3}\t{taken + 5000}\n")
        monkeypatch.setattr(processes, "_EPHEMERAL_RANGE_FILE", fake)
        monkeypatch.setattr(processes, "_LOWEST_CHOSEN_PORT", taken + 3 - 1000)
        for _ in range(100):
            run = free_ports(3, consecutive=True)
            assert run == list(range(run[0], run[0] + 3))
            assert taken not in run
            assert run[-1] < taken + 3


def test_when_the_kernel_owns_nearly_every_port_it_chooses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "range"
    fake.write_text("1024\t65000\n")
    monkeypatch.setattr(processes, "_EPHEMERAL_RANGE_FILE", fake)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(port > 0 for port in ports)
