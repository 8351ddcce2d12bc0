"""A real Prefect server for the test session, on a free port with its own database, and clients pointed at it.

Test modules that need it say ``pytest_plugins = ["tests.fixtures_prefect"]``. The server starts on first use (a
fresh database: about 20 s on two busy cores, most of it migrations) and stops when the session ends.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra.prefect_server import OFFLINE_ENVIRONMENT, LocalPrefectServer
from infra.processes import free_ports

for _key, _value in OFFLINE_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)


@contextmanager
def session_server(state_dir: Path) -> Iterator[LocalPrefectServer]:
    """A Prefect server for this process (and processes it starts) until the block ends; then what Prefect still holds
    for it is sent, the server stops, and nothing more is sent to an API.

    Prefect sends run logs and events from background workers, and sends whatever they hold at interpreter exit. A
    run logger used after the server stopped (an adapter that outlived its run) would make it start a temporary
    server at exit, with PREFECT_API_URL unset by then, only to post one line: seconds of delay and, when that
    server or the event loop is already gone, tracebacks after the last test.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    (port,) = free_ports(1)
    server = LocalPrefectServer(state_dir=state_dir, port=port, ui=False)
    server.up(timeout_s=240)
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url  # for subprocesses, e.g. `precursor flows serve`
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield server
            finally:
                _send_what_is_queued()  # while the server still listens
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        server.down()
        _stop_logging_to_the_api()


def _send_what_is_queued(timeout_s: float = 60.0) -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        _, pending = worker.drain_all(timeout=timeout_s)
        if pending:
            warnings.warn(f"{worker.__name__} still had work after {timeout_s:g} s; it is dropped", stacklevel=2)


def _stop_logging_to_the_api() -> None:
    """Run loggers keep logging to the console; only the handler that posts to the (stopped) API goes."""
    from prefect.logging.handlers import APILogHandler

    loggers = [logging.root, *(v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in [h for h in logger.handlers if isinstance(h, APILogHandler)]:
            logger.removeHandler(handler)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrefectServer]:
    """The session's Prefect server; Prefect clients in this process (and processes it starts) talk to it."""
    with session_server(tmp_path_factory.mktemp("prefect-state")) as server:
        yield server
