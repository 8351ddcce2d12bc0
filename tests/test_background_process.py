"""BackgroundProcess.wait_until_ready, with real child processes: a start-up that succeeds, one that dies, and one
that never answers (stopped, with its log in the error)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from infra.processes import BackgroundProcess

MARKER = "precursor-test-background-process"


class ServiceError(RuntimeError):
    pass


def service(tmp_path: Path) -> BackgroundProcess:
    return BackgroundProcess(
        tmp_path / "service.pid", is_ours=lambda cmdline: MARKER in cmdline, name="test service", error=ServiceError
    )


def launch(process: BackgroundProcess, tmp_path: Path, code: str) -> int:
    return process.launch([sys.executable, "-c", code, MARKER], output=tmp_path / "service.log", cwd=tmp_path)


def test_returns_once_ready_answers(tmp_path: Path) -> None:
    process = service(tmp_path)
    pid = launch(process, tmp_path, "import time; time.sleep(60)")
    answers = iter([False, False, True])
    try:
        process.wait_until_ready(
            pid, time.monotonic() + 10, ready=lambda _timeout_s: next(answers), address="here", logs=[]
        )
        assert process.running_pid() == pid
    finally:
        assert process.stop(5.0, lambda _line: None, absent="gone")
    assert not process.alive(pid)


def test_a_service_that_dies_on_start_up_is_named_with_its_log(tmp_path: Path) -> None:
    process = service(tmp_path)
    pid = launch(process, tmp_path, "print('cannot bind the port'); raise SystemExit(3)")
    with pytest.raises(ServiceError, match=rf"the test service \(pid {pid}\) exited during start-up") as caught:
        process.wait_until_ready(
            pid, time.monotonic() + 10, ready=lambda _t: False, address="here", logs=[tmp_path / "service.log"]
        )
    assert "cannot bind the port" in str(caught.value)
    assert not process.pid_file.exists()


def test_a_service_that_never_answers_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    process = service(tmp_path)
    pid = launch(process, tmp_path, "import time; print('still loading', flush=True); time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(ServiceError, match=r"did not answer at 127\.0\.0\.1:1 in time and was stopped") as caught:
        process.wait_until_ready(
            pid, started + 1.0, ready=lambda _t: False, address="127.0.0.1:1", logs=[tmp_path / "service.log"]
        )
    assert "still loading" in str(caught.value)
    assert time.monotonic() - started < 10
    assert not process.alive(pid)
    assert not process.pid_file.exists()


def test_an_unreadable_command_line_is_read_again_not_taken_for_a_stranger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux shows an empty command line for a moment after exec (1 read in 20 right after a JVM's launch here). A
    status check in that moment once took a starting Flink task manager for dead and dropped its pid file."""
    import infra.processes as processes

    launcher = service(tmp_path)
    pid = launch(launcher, tmp_path, "import time; time.sleep(60)")
    real = processes.process_cmdline
    empty_reads = iter(range(3))  # the first three reads come back empty, as just after exec

    def settling(p: int) -> str | None:
        return None if next(empty_reads, None) is not None else real(p)

    monkeypatch.setattr(processes, "process_cmdline", settling)
    try:
        assert service(tmp_path).running_pid() == pid
        assert launcher.pid_file.exists()
        monkeypatch.setattr(processes, "process_cmdline", lambda _p: None)  # never readable: not ours, but kept
        assert service(tmp_path).running_pid() is None
        assert launcher.pid_file.exists(), "a live process's pid file was dropped on an unreadable command line"
        assert launcher.running_pid() == pid  # the launcher polls its own child
    finally:
        monkeypatch.setattr(processes, "process_cmdline", real)
        assert launcher.stop(5.0, lambda _line: None, absent="gone")
