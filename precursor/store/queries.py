"""The questions people ask of the store, without SQL. Each returns plain rows (dicts) for any front end.

Open a :class:`StoreReader` with :func:`reading` and ask it as many questions as a page needs over one read-only
connection. It answers by what is asked about, one module each: the fleet (:mod:`precursor.store.fleet_queries`), one
machine
(:mod:`precursor.store.machine_queries`), the models (:mod:`precursor.store.model_queries`) and raw SQL
(:mod:`precursor.store.sql_queries`), all
built on :mod:`precursor.store.reader_base`. The module-level :func:`at_risk`, :func:`machine_history` and
:func:`counts_per_edge` are one-shot conveniences. Tables that a store may not have yet (alerts, heartbeats,
telemetry summaries, model metrics) read as empty, so a young store answers every question.

Time ranges are written as people write them: a duration back from now (``6h``, ``7d``), ``now``, or a time.

>>> from datetime import UTC, datetime
>>> now = datetime(2026, 3, 1, 12, tzinfo=UTC)
>>> parse_time_bound("6h", now=now).isoformat()
'2026-03-01T06:00:00+00:00'
>>> parse_time_bound("2026-02-01", now=now).isoformat()
'2026-02-01T00:00:00+00:00'
>>> parse_time_bound("last tuesday", now=now, name="since")
Traceback (most recent call last):
...
ValueError: since='last tuesday' is neither a duration back from now (30m, 6h, 7d) nor a time (2026-01-01T00:00Z)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import duckdb

from precursor.contracts.alerting import DEFAULT_THRESHOLD
from precursor.store.db import StoreBusy, connect
from precursor.store.fleet_queries import FleetQueries
from precursor.store.location import StoreLocation, is_postgres, redact
from precursor.store.machine_queries import MachineQueries
from precursor.store.model_queries import ModelQueries
from precursor.store.reader_base import (
    ELEVATED_LOOKBACK,
    READ_ONLY_SESSION,
    Page,
    SqlRejected,
    SqlResult,
    _first_line,
    check_range,
    parse_time_bound,
)
from precursor.store.sql_queries import SqlQueries, check_read_only_sql

# The store's front door: what the API, the command line and the tests ask for, wherever it is defined.
__all__ = [
    "DEFAULT_THRESHOLD",
    "ELEVATED_LOOKBACK",
    "Page",
    "SqlRejected",
    "SqlResult",
    "StoreAttacher",
    "StoreReader",
    "at_risk",
    "check_range",
    "check_read_only_sql",
    "counts_per_edge",
    "machine_history",
    "parse_time_bound",
    "reading",
]


class StoreReader(FleetQueries, MachineQueries, ModelQueries, SqlQueries):
    """Answers over one open read-only connection. Build it with :func:`reading`."""


@contextmanager
def reading(path: StoreLocation, *, wait_s: float = 10.0) -> Iterator[StoreReader]:
    """A read-only view of the store for the length of a ``with`` block (so writers are never shut out for long).

    The connection cannot reach files, the network or extensions: raw SQL sees the store's tables and nothing else.
    On PostgreSQL the session is read-only (and the store's role should be one without file access).
    """
    with connect(path, read_only=True, wait_s=wait_s) as con:
        con.execute(READ_ONLY_SESSION[is_postgres(path)])
        yield StoreReader(con)


class StoreAttacher:
    """Read-only views for a long-running reader (the HTTP API) that asks many small questions.

    Starting a DuckDB instance costs tens of milliseconds, more than the questions themselves; so one in-memory
    instance lives as long as the reader, and each :meth:`reading` attaches the store file read-only and detaches it
    afterwards. Like a connection per request, that holds the file (and shuts the pipeline's writer out) only while a
    question is being answered. Not for raw SQL: this instance can reach files; use :func:`reading` for that.
    """

    def __init__(self, path: StoreLocation, *, wait_s: float = 10.0) -> None:
        self.location = path
        self.path = Path(path)
        self.wait_s = wait_s
        self._base: duckdb.DuckDBPyConnection | None = None
        self._read_pool: Any = None  # store.postgres.ReadPool, made on first use
        self._lock = threading.Lock()

    def _instance(self) -> duckdb.DuckDBPyConnection:
        """The in-memory instance, started on first use (and again after :meth:`close`)."""
        with self._lock:
            if self._base is None:
                self._base = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
                self._base.execute("SET GLOBAL TimeZone = 'UTC'")
            return self._base

    @contextmanager
    def reading(self) -> Iterator[StoreReader]:
        if is_postgres(self.location):  # the server answers many readers itself; connections are kept open
            with self._pool().connection(self.wait_s) as con:
                if con.execute("SELECT to_regclass('predictions')").fetchone() == (None,):
                    raise FileNotFoundError(
                        f"no prediction store in {redact(self.location)}: run `precursor pipeline run` first"
                    )
                yield StoreReader(con)  # type: ignore[arg-type]  # the calls StoreReader makes of a connection
            return
        if not self.path.exists():
            raise FileNotFoundError(f"no prediction store at {self.path}: run `precursor pipeline run` first")
        alias = f"store_{uuid4().hex[:16]}"
        cursor = self._instance().cursor()
        try:
            self._attach(cursor, alias)
            try:
                cursor.execute(f"USE {alias}")
                yield StoreReader(cursor)
            finally:
                cursor.execute("USE memory")
                cursor.execute(f"DETACH {alias}")
        finally:
            cursor.close()

    def _attach(self, cursor: duckdb.DuckDBPyConnection, alias: str) -> None:
        quoted = str(self.path).replace("'", "''")
        deadline = time.monotonic() + self.wait_s
        delay = 0.01
        while True:
            try:
                cursor.execute(f"ATTACH '{quoted}' AS {alias} (READ_ONLY)")
                return
            except duckdb.IOException as err:
                if "lock" not in str(err).lower() or time.monotonic() > deadline:
                    raise StoreBusy(f"prediction store {self.path} is busy: {_first_line(err)}") from err
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def _pool(self) -> Any:
        from precursor.store.postgres import ReadPool  # psycopg and sqlglot: only for a PostgreSQL store

        with self._lock:
            if self._read_pool is None:
                self._read_pool = ReadPool(str(self.location))
            return self._read_pool

    def close(self) -> None:
        """Stop the in-memory instance (close the kept PostgreSQL connections); the next :meth:`reading` starts
        anew."""
        with self._lock:
            base, self._base = self._base, None
            pool, self._read_pool = self._read_pool, None
        if base is not None:
            base.close()
        if pool is not None:
            pool.close()


def at_risk(path: str | Path, *, limit: int = 10, since: datetime | None = None) -> list[dict[str, Any]]:
    """Each machine's latest prediction (by window end), riskiest first."""
    with reading(path) as store:
        return store.at_risk(limit=limit, since=since).rows


def machine_history(
    path: str | Path, machine_id: str, *, limit: int = 100, since: datetime | None = None
) -> list[dict[str, Any]]:
    """One machine's predictions, newest first."""
    with reading(path) as store:
        return store.machine_history(machine_id, limit=limit, since=since).rows


def counts_per_edge(path: str | Path) -> list[dict[str, Any]]:
    """How many predictions each edge sent, over how many machines, and when it was last heard of."""
    with reading(path) as store:
        return store.counts_per_edge()
