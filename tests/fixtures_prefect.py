"""A real Prefect server for the test session, on a free port with its own database, and clients pointed at it.

Test modules that need it say ``pytest_plugins = ["tests.fixtures_prefect"]``. The server starts on first use (a
fresh database: about 20 s on two busy cores, most of it migrations) and stops when the session ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from flows.server import OFFLINE_ENVIRONMENT, LocalPrefectServer
from infra.kafka_broker import free_ports

for _key, _value in OFFLINE_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrefectServer]:
    """The session's Prefect server; Prefect clients in this process (and processes it starts) talk to it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    (port,) = free_ports(1)
    server = LocalPrefectServer(state_dir=tmp_path_factory.mktemp("prefect-state"), port=port, ui=False)
    server.up(timeout_s=240)
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url  # for subprocesses, e.g. `precursor flows serve`
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server
    finally:
        try:
            # Logs and events go to the server in the background: send what is queued while it still listens.
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)
            EventsWorker.drain_all(timeout=10)
        finally:
            if previous is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = previous
            server.down()
