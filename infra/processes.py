"""The background services this project starts (the Kafka broker, the Prefect server): launch, wait until ready,
find again, stop.

A service runs in its own process session, so it outlives the command that started it and ignores its Ctrl-C. Its
pid file says which process it is; a pid is taken as ours only while that process lives and its command line is
the one we started (pids get reused), and a stale pid file is removed. Stopping is SIGTERM, then SIGKILL.

>>> port_in_use("127.0.0.1", 0)
False
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Report = Callable[[str], None]

log = logging.getLogger(__name__)

_LOG_TAIL_LINES = 40  # enough for the top of a JVM stack trace, where a failed start-up says why
_CMDLINE_SETTLE_S = 1.0
_STOP_TIMEOUT_S = 30.0  # a service that failed to come up gets as long to stop as one stopped on purpose


def process_cmdline(pid: int) -> str | None:
    """The process's command line, arguments joined by spaces; None when there is no such process."""
    if Path("/proc/self/cmdline").exists():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None
    done = subprocess.run(["ps", "-ww", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def is_zombie(pid: int) -> bool:
    """Exited but not yet reaped: ``kill(pid, 0)`` still succeeds, yet nothing runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def port_in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails now (something listens there, or is about to)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` of a log file, for an error message; says so when there is no file yet."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name} yet)"


def _last_lines(logs: Sequence[Path]) -> str:
    return "\n".join(f"Last lines of {path}:\n{log_tail(path, _LOG_TAIL_LINES)}" for path in logs)


class BackgroundProcess:
    """One background service, known by its pid file.

    ``is_ours(cmdline)`` tells our process from another one that got the same pid; ``name`` is how messages call it
    ("broker", "Prefect server"); ``error`` is the exception type raised when it cannot be stopped.
    """

    def __init__(
        self, pid_file: Path, *, is_ours: Callable[[str], bool], name: str, error: type[Exception] = RuntimeError
    ) -> None:
        self.pid_file = pid_file
        self.name = name
        self._is_ours = is_ours
        self._error = error
        self._process: subprocess.Popen[bytes] | None = None  # set when this process launched it: poll() reaps it

    def launch(self, command: Sequence[str], *, output: Path, cwd: Path, env: Mapping[str, str] | None = None) -> int:
        """Start ``command`` in its own session with stdout and stderr appended to ``output``; returns its pid."""
        output.parent.mkdir(parents=True, exist_ok=True)
        with output.open("ab") as out:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,  # outlives this process and ignores its Ctrl-C
            )
        self._process = process
        self.pid_file.write_text(f"{process.pid}\n")
        return process.pid

    def alive(self, pid: int) -> bool:
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not is_zombie(pid)

    def running_pid(self) -> int | None:
        """The pid of our live service; a stale pid file (process gone, or the pid reused) is removed."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if self._process is not None and self._process.pid == pid and self._process.poll() is None:
            return pid  # started here and not yet reaped: the pid cannot have gone to anyone else
        if self.alive(pid):
            cmdline = self._settled_cmdline(pid)
            if cmdline is not None and self._is_ours(cmdline):
                return pid
            if cmdline is None and self.alive(pid):
                return None  # still unreadable: neither ours for sure nor gone, so the pid file stays
        self.pid_file.unlink(missing_ok=True)
        return None

    def _settled_cmdline(self, pid: int) -> str | None:
        """The command line, read again for a moment while it is empty. Linux shows an empty one just after exec
        (1 read in 20 right after a JVM's launch, measured) and while a process exits: taking that as "not ours"
        once dropped the pid file of a task manager that was starting, and orphaned it."""
        deadline = time.monotonic() + _CMDLINE_SETTLE_S
        while True:
            cmdline = process_cmdline(pid)
            if cmdline is not None or time.monotonic() > deadline or not self.alive(pid):
                return cmdline
            time.sleep(0.01)

    def wait_for_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive(pid):
                return True
            time.sleep(0.1)
        return not self.alive(pid)

    def forget(self) -> None:
        """The service exited on its own (e.g. during start-up): drop its pid file."""
        self.pid_file.unlink(missing_ok=True)

    def wait_until_ready(
        self, pid: int, deadline: float, *, ready: Callable[[float], bool], address: str, logs: Sequence[Path]
    ) -> None:
        """Return once ``ready(timeout_s)`` is true. If the service exits first, or is still not ready at ``deadline``
        (it is stopped then), raise with the last lines of ``logs``: a failed start-up explains itself there."""
        while True:
            if not self.alive(pid):
                self.forget()
                raise self._error(f"the {self.name} (pid {pid}) exited during start-up. {_last_lines(logs)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if ready(min(1.0, remaining)):
                return
            time.sleep(0.1)
        self.stop(_STOP_TIMEOUT_S, log.info, absent=f"the {self.name} is gone already")
        raise self._error(f"the {self.name} did not answer at {address} in time and was stopped. {_last_lines(logs)}")

    def stop(self, timeout_s: float, say: Report, *, absent: str) -> bool:
        """SIGTERM, then SIGKILL after ``timeout_s``. False (after saying ``absent``) when ours was not running."""
        pid = self.running_pid()
        if pid is None:
            say(absent)
            return False
        say(f"stopping the {self.name} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        if not self.wait_for_exit(pid, timeout_s):
            say(f"the {self.name} (pid {pid}) still runs after {timeout_s:.0f} s: killing it")
            os.kill(pid, signal.SIGKILL)
            if not self.wait_for_exit(pid, 10.0):
                raise self._error(f"the {self.name} (pid {pid}) survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)
        self._process = None
        say(f"{self.name} stopped")
        return True
