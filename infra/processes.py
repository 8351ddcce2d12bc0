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
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
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


_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default; macOS hands out 49152-65535, above it anyway
_LOWEST_CHOSEN_PORT = 10000  # below this live the well-known services people run on purpose
_PORT_TRIES = 200
_pick = random.SystemRandom()  # not the global generator: tests seed that, and two workers would pick alike


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel picks by itself: for ``bind(0)`` and as the source port of every outgoing connection."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def free_ports(count: int, host: str = "127.0.0.1", *, consecutive: bool = False) -> list[int]:
    """``count`` distinct ports that nothing listens on right now, e.g. for a throwaway broker in a test.

    They come from below the kernel's ephemeral range. A port that ``bind(0)`` hands out is one the kernel may also
    give any outgoing connection as its source port in the seconds before the service binds it; with tests in
    parallel workers, a broker's controller port was taken that way. Below that range only another deliberate choice
    can collide, and the choice is random. ``consecutive`` asks for a run ``first, first + 1, ...`` (a cluster whose
    nodes number their ports from one base).

    >>> first, second = free_ports(2)
    >>> first != second and min(first, second) > 0
    True
    >>> run = free_ports(3, consecutive=True)
    >>> run == list(range(run[0], run[0] + 3))
    True
    """
    low, high = ephemeral_port_range()
    candidates = range(_LOWEST_CHOSEN_PORT, low) if low - _LOWEST_CHOSEN_PORT >= 1000 else range(high + 1, 65536)
    if len(candidates) < 1000:  # the kernel owns nearly every port: let it choose
        return _kernel_chosen_ports(count, host)
    for _ in range(_PORT_TRIES):
        if consecutive:
            first = _pick.randrange(candidates.start, candidates.stop - count + 1)
            ports = list(range(first, first + count))
        else:
            ports = _pick.sample(candidates, count)
        if not any(port_in_use(host, port) for port in ports):
            return ports
    raise OSError(f"found no {count} free ports between {candidates.start} and {candidates.stop - 1} on {host}")


def _kernel_chosen_ports(count: int, host: str) -> list[int]:
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:  # all bound at once, so the kernel hands out different ports
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in probes]


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
