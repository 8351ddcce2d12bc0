"""A local Prefect server that this project starts in the background and stops by its pid: offline, no Docker.

Schedules only run against a real server (the ephemeral one that Prefect starts inside a process has no scheduler
to speak of), so ``precursor flows serve`` needs this. Everything lives under one folder, ``<state>/prefect`` by
default (``$PRECURSOR_STATE_DIR`` moves it)::

    <state>/prefect/prefect.db     the server's SQLite database (Prefect's default, under its PREFECT_HOME)
    <state>/prefect/server.pid     the pid of the server we started
    <state>/prefect/server.json    where it listens (host, port), so status and clients find it
    <state>/prefect/server.log     what the server prints

``down`` stops a process only after checking that its command line is ``prefect server start`` with our port, so it
never touches another server (or anything else that reused the pid).

>>> server = LocalPrefectServer(state_dir="/tmp/precursor-state", port=14200)
>>> server.api_url
'http://127.0.0.1:14200/api'
>>> str(server.home)
'/tmp/precursor-state/prefect'
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

Report = Callable[[str], None]
Port = Annotated[int, Field(ge=1, le=65535)]
_LOG_TAIL_LINES = 30

OFFLINE_ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # The first start on a fresh database runs every migration: slow on two busy cores, never a reason to give up.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}
"""Variables every Prefect process this project starts gets: no analytics, nothing phoned home."""


class PrefectServerError(RuntimeError):
    """The local Prefect server could not be started or stopped; the message says why and where its log is."""


class PrefectServerStatus(BaseModel):
    """What ``precursor flows server status`` shows."""

    model_config = ConfigDict(frozen=True)

    running: bool = Field(description="our server process is alive")
    healthy: bool = Field(description="it answers /api/health")
    pid: int | None
    api_url: str
    home: Path


def _process_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        done = subprocess.run(["ps", "-ww", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
        return done.stdout.strip() or None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name} yet)"


def api_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """Whether a Prefect API answers its health check at ``api_url`` (``http://host:port/api``)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class LocalPrefectServer(BaseSettings):
    """A single Prefect server process with a SQLite database, started and stopped by this project.

    Settings come from arguments, then ``PRECURSOR_LOCAL_PREFECT_*`` variables (``PRECURSOR_STATE_DIR`` for the state
    folder). ``up`` and ``down`` are idempotent.
    """

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_LOCAL_PREFECT_", populate_by_name=True, extra="forbid")

    state_dir: Path = Field(
        Path(".state"),
        validation_alias="PRECURSOR_STATE_DIR",
        description="the server keeps its files in <state>/prefect",
    )
    home_dir: Path | None = Field(None, description="the server's PREFECT_HOME; <state_dir>/prefect by default")
    host: str = Field("127.0.0.1", min_length=1, description="address the API binds")
    port: Port = 4200
    ui: bool = Field(True, description="serve the dashboard too (it ships inside the prefect package)")

    _process: subprocess.Popen[bytes] | None = PrivateAttr(None)

    @field_validator("state_dir", "home_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser().absolute()

    # Layout ------------------------------------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        return self.home_dir if self.home_dir is not None else self.state_dir / "prefect"

    @property
    def pid_file(self) -> Path:
        return self.home / "server.pid"

    @property
    def address_file(self) -> Path:
        return self.home / "server.json"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def api_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/api"

    def environment(self) -> dict[str, str]:
        """Variables for the server and for any client of it: its home, its address, and no analytics."""
        return {**OFFLINE_ENVIRONMENT, "PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api_url}

    # Verbs -------------------------------------------------------------------------------------------------------

    def up(self, timeout_s: float = 120.0, report: Report | None = None) -> PrefectServerStatus:
        """Start the server unless ours already runs, and wait until ``/api/health`` answers."""
        say = report or log.info
        started_at = time.monotonic()
        pid = self._running_pid()
        if pid is not None:
            running_at = self._running_api_url()
            if running_at != self.api_url:
                raise PrefectServerError(
                    f"the Prefect server of {self.home} already runs at {running_at}, not at {self.api_url}: "
                    "stop it (precursor flows server down) to change its port"
                )
            say(f"Prefect server already running (pid {pid}) at {self.api_url}")
        else:
            if _port_in_use(self.host, self.port):
                raise PrefectServerError(
                    f"port={self.port} on {self.host} is in use by another process (not the Prefect server of "
                    f"{self.home}): stop it, or choose another port (PRECURSOR_LOCAL_PREFECT_PORT)"
                )
            say(f"starting the Prefect server at {self.api_url} (database and log in {self.home})")
            pid = self._launch()
        self._wait_until_healthy(pid, started_at + timeout_s)
        say(f"Prefect server ready at {self.api_url} in {time.monotonic() - started_at:.1f} s (pid {pid})")
        return self.status()

    def down(self, timeout_s: float = 30.0, report: Report | None = None) -> bool:
        """Stop our server: SIGTERM, then SIGKILL after ``timeout_s``. False when ours was not running."""
        say = report or log.info
        pid = self._running_pid()
        if pid is None:
            say(f"no Prefect server of {self.home} is running")
            return False
        say(f"stopping the Prefect server (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        if not self._wait_for_exit(pid, timeout_s):
            say(f"Prefect server (pid {pid}) still running after {timeout_s:.0f} s: killing it")
            os.kill(pid, signal.SIGKILL)
            if not self._wait_for_exit(pid, 10.0):
                raise PrefectServerError(f"Prefect server pid {pid} survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)
        self._process = None
        say("Prefect server stopped")
        return True

    def status(self) -> PrefectServerStatus:
        """Our server's state. A running server reports the address it was started with, whatever the settings say."""
        pid = self._running_pid()
        api_url = self._running_api_url() if pid is not None else self.api_url
        return PrefectServerStatus(
            running=pid is not None,
            healthy=pid is not None and api_healthy(api_url),
            pid=pid,
            api_url=api_url,
            home=self.home,
        )

    # Process ----------------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--analytics-off",
            "--ui" if self.ui else "--no-ui",
        ]

    def _launch(self) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.environment()}
        env.pop("PREFECT_API_URL")  # the server itself is no client; an inherited URL would only confuse its logs
        with self.log_file.open("ab") as out:
            process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=env,
                start_new_session=True,  # outlives this process and ignores its Ctrl-C
            )
        self._process = process
        self.pid_file.write_text(f"{process.pid}\n")
        self.address_file.write_text(json.dumps({"host": self.host, "port": self.port, "api_url": self.api_url}) + "\n")
        return process.pid

    def _is_ours(self, pid: int) -> bool:
        cmdline = _process_cmdline(pid)
        return cmdline is not None and "prefect server start" in cmdline and f"--port {self._running_port()}" in cmdline

    def _alive(self, pid: int) -> bool:
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _is_zombie(pid)

    def _running_pid(self) -> int | None:
        """The pid of our live server; a stale pid file (process gone, or the pid reused) is removed."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if self._alive(pid) and self._is_ours(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def _running_address(self) -> dict[str, object]:
        try:
            return dict(json.loads(self.address_file.read_text()))
        except (OSError, ValueError):
            return {}

    def _running_port(self) -> int:
        port = self._running_address().get("port")
        return int(port) if isinstance(port, int) else self.port

    def _running_api_url(self) -> str:
        url = self._running_address().get("api_url")
        return str(url) if url else self.api_url

    def _wait_for_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._alive(pid):
                return True
            time.sleep(0.1)
        return not self._alive(pid)

    def _wait_until_healthy(self, pid: int, deadline: float) -> None:
        while True:
            if not self._alive(pid):
                self.pid_file.unlink(missing_ok=True)
                raise PrefectServerError(
                    f"the Prefect server (pid {pid}) exited during start-up. Last lines of {self.log_file}:\n"
                    f"{_tail(self.log_file)}"
                )
            if api_healthy(self.api_url, timeout_s=1.0):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        self.down(report=log.info)
        raise PrefectServerError(
            f"the Prefect server did not answer at {self.api_url} in time and was stopped. "
            f"Last lines of {self.log_file}:\n{_tail(self.log_file)}"
        )
