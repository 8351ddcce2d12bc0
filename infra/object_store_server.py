"""A local S3-compatible server for development and the tests: gofakes3, built once with ``go install``.

It serves buckets from a folder (``-backend fs``), path-style on loopback, and is a real HTTP S3 server in its own
process, so the labeled dataset, the registry and the edges' downloads go through s3fs and botocore exactly as they
would against a cloud bucket. It checks no credentials: that is for the real thing (the clients still sign every
request, so the signing path runs). ``precursor objects install`` builds it (the test script does), ``precursor
objects serve`` runs one in the foreground.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from infra.go_tools import GoInstallError, go_install
from infra.processes import BackgroundProcess, Report, free_ports, log_tail
from precursor.contracts.object_store import ObjectStoreSettings
from precursor.contracts.settings import PrecursorSettings

S3_SERVER_MODULE = "github.com/johannesboyne/gofakes3/cmd/gofakes3"
S3_SERVER_VERSION = "v1.2.0"
BINARY = "gofakes3"
LOCAL_KEY_ID = "precursor-local"
"""The local server takes any key; clients need one to sign with."""


class ObjectStoreServerError(RuntimeError):
    """The local S3 server could not be built, started or stopped; the text says why."""


def tools_root() -> Path:
    return PrecursorSettings().state_dir / "tools"


def binary_path(root: Path | None = None) -> Path:
    return (root or tools_root()) / BINARY / S3_SERVER_VERSION / BINARY


def install_s3_server(root: Path | None = None, *, report: Report = print) -> Path:
    """Build the server with ``go install`` into the tools folder (once; later calls return at once)."""
    try:
        return go_install(
            S3_SERVER_MODULE, S3_SERVER_VERSION, binary_path(root), purpose="the local S3 server", report=report
        )
    except GoInstallError as err:
        raise ObjectStoreServerError(str(err)) from None


class LocalS3:
    """One gofakes3 process serving the buckets under ``data_dir`` on ``127.0.0.1:port``."""

    def __init__(
        self, data_dir: Path, *, port: int | None = None, bucket: str = "precursor", binary: Path | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_ports(1)[0]
        self.bucket = bucket
        self.binary = binary or binary_path()
        self.log = data_dir / "server.log"
        self._process = BackgroundProcess(
            data_dir / "server.pid",
            is_ours=lambda cmdline: BINARY in cmdline and f"127.0.0.1:{self.port}" in cmdline,
            name="local S3 server",
            error=ObjectStoreServerError,
        )

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> ObjectStoreSettings:
        """Client settings for this server (any key signs: it checks none)."""
        return ObjectStoreSettings(
            endpoint_url=self.endpoint_url,
            access_key_id=LOCAL_KEY_ID,
            secret_access_key="local-secret",  # type: ignore[arg-type]
            region="us-east-1",
            addressing_style="path",
        )

    def command(self) -> list[str]:
        return [
            str(self.binary.absolute()),
            "-backend",
            "fs",
            "-fs.path",
            str(self.data_dir.absolute() / "buckets"),
            "-fs.create",
            "-host",
            f"127.0.0.1:{self.port}",
            "-initialbucket",
            self.bucket,
            "-quiet",
        ]

    def up(self, timeout_s: float = 30.0) -> None:
        """Start the server and return once it answers."""
        if not self.binary.is_file():
            raise ObjectStoreServerError(
                f"no local S3 server at {self.binary}: run `precursor objects install` once (needs Go)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        pid = self._process.launch(self.command(), output=self.log, cwd=self.data_dir)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._process.alive(pid):
                self._process.forget()
                raise ObjectStoreServerError(f"the local S3 server exited on start:\n{log_tail(self.log)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.down()
        raise ObjectStoreServerError(
            f"the local S3 server did not answer within {timeout_s:g} s:\n{log_tail(self.log)}"
        )

    def down(self, report: Report = lambda _: None) -> None:
        self._process.stop(10.0, report, absent="the local S3 server is not running")
