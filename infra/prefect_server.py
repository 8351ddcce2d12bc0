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
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.processes import BackgroundProcess, port_in_use
from infra.service_settings import AbsolutePath, Port

log = logging.getLogger(__name__)

Report = Callable[[str], None]

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

    state_dir: AbsolutePath = Field(
        Path(".state"),
        validation_alias="PRECURSOR_STATE_DIR",
        description="the server keeps its files in <state>/prefect",
    )
    home_dir: AbsolutePath | None = Field(None, description="the server's PREFECT_HOME; <state_dir>/prefect by default")
    host: str = Field("127.0.0.1", min_length=1, description="address the API binds")
    port: Port = 4200
    ui: bool = Field(True, description="serve the dashboard too (it ships inside the prefect package)")

    _service: BackgroundProcess | None = PrivateAttr(None)

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
            if port_in_use(self.host, self.port):
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
        return self.service.stop(timeout_s, report or log.info, absent=f"no Prefect server of {self.home} is running")

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

    @property
    def service(self) -> BackgroundProcess:
        """The server process, known by its pid file and its command line."""
        if self._service is None:
            self._service = BackgroundProcess(
                self.pid_file,
                is_ours=lambda cmdline: (
                    "prefect server start" in cmdline and f"--port {self._running_port()}" in cmdline
                ),
                name="Prefect server",
                error=PrefectServerError,
            )
        return self._service

    def _launch(self) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.environment()}
        env.pop("PREFECT_API_URL")  # the server itself is no client; an inherited URL would only confuse its logs
        pid = self.service.launch(self.command(), output=self.log_file, cwd=self.home, env=env)
        self.address_file.write_text(json.dumps({"host": self.host, "port": self.port, "api_url": self.api_url}) + "\n")
        return pid

    def _running_pid(self) -> int | None:
        return self.service.running_pid()

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

    def _wait_until_healthy(self, pid: int, deadline: float) -> None:
        self.service.wait_until_ready(
            pid,
            deadline,
            ready=lambda timeout_s: api_healthy(self.api_url, timeout_s=timeout_s),
            address=self.api_url,
            logs=[self.log_file],
        )
