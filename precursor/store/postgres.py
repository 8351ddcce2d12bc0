"""The prediction store on PostgreSQL, for many writers on many machines (``PRECURSOR_STORE_URL=postgresql://...``).

:class:`PostgresConnection` answers the calls the store makes of a DuckDB connection (``execute``, ``executemany``,
``fetchone``, ``fetchall``, ``description``), translating each statement once (:mod:`precursor.store.dialect`), so the
schema and every question are the same texts on both. Rows go in by ``COPY`` into a temporary table, then one
``INSERT ... ON CONFLICT`` by the table's key, in one transaction: a rerun over the same Kafka offsets, or two
writers with the same rows, store each ``(edge_id, seq)`` once.

The password is never part of what is shown: give it by ``PGPASSWORD`` or a ``PGPASSFILE`` (libpq reads both), or in
the URL, which every message prints redacted.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import errors
from psycopg.types.string import TextLoader
from pyarrow import csv

from precursor.store.dialect import POSTGRES_FUNCTIONS, to_postgres
from precursor.store.errors import StoreUnreachable
from precursor.store.ledger import LEDGER_INSERT
from precursor.store.location import redact


class PostgresConnection:
    """A DuckDB-like face on one psycopg connection (autocommit: ``BEGIN``/``COMMIT`` as the store sends them)."""

    def __init__(self, con: psycopg.Connection[Any]) -> None:
        self.raw = con
        self._cur: psycopg.Cursor[Any] | None = None

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> PostgresConnection:
        translated = to_postgres(sql)
        cur = self.raw.cursor()
        bound = translated.bind(params or [])
        with self._schema_change(translated.statements):
            for statement in translated.statements:
                cur.execute(statement, bound or {}, prepare=False)
        self._cur = cur
        return self

    @contextmanager
    def _schema_change(self, statements: Sequence[str]) -> Iterator[None]:
        """DDL one writer at a time: PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is no guard against another
        session making the same table at the same moment (a unique violation in its catalog)."""
        if not any(s.lstrip()[:6].upper() in ("CREATE", "ALTER ", "DROP T") for s in statements):
            yield
            return
        with self.raw.transaction():
            self.raw.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEMA_LOCK_KEY])
            yield

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> PostgresConnection:
        translated = to_postgres(sql)
        (statement,) = translated.statements
        cur = self.raw.cursor()
        cur.executemany(statement, [translated.bind(r) or {} for r in rows])
        self._cur = cur
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._cursor().fetchone()

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cursor().fetchall()

    @property
    def description(self) -> Any:
        return self._cursor().description

    def cursor(self) -> PostgresConnection:
        return PostgresConnection(self.raw)

    def interrupt(self) -> None:
        self.raw.cancel_safe()

    def close(self) -> None:
        self.raw.close()

    def _cursor(self) -> psycopg.Cursor[Any]:
        if self._cur is None:
            raise RuntimeError("no statement has run on this connection")
        return self._cur


_SCHEMA_DONE: set[str] = set()
_SCHEMA_GUARD = threading.Lock()
SCHEMA_LOCK_KEY = 0x5052_4543  # any fixed number: the advisory lock that serialises schema changes


@contextmanager
def connect(url: str, *, schema: str | None, wait_s: float = 10.0) -> Iterator[PostgresConnection]:
    """A connection in UTC that reads JSON as text (as DuckDB hands it over); with ``schema`` (the store's DDL) the
    tables are made first, once per process and database."""
    raw = _open(url, wait_s)
    try:
        con = PostgresConnection(raw)
        if schema is not None and url not in _SCHEMA_DONE:
            with _SCHEMA_GUARD, raw.transaction():
                raw.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEMA_LOCK_KEY])
                raw.execute(POSTGRES_FUNCTIONS)
                con.execute(schema)
                _SCHEMA_DONE.add(url)
        yield con
    finally:
        raw.close()


def _open(url: str, wait_s: float) -> psycopg.Connection[Any]:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            raw = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(wait_s)))
            break
        except psycopg.OperationalError as err:
            if time.monotonic() > deadline:
                raise StoreUnreachable(
                    f"prediction store {redact(url)} is unreachable: {_first_line(err, url)}"
                ) from None
            time.sleep(0.2)
    for name in ("json", "jsonb"):
        raw.adapters.register_loader(name, TextLoader)
    raw.execute("SET TimeZone = 'UTC'")
    return raw


class ReadPool:
    """Read-only connections kept open for a long-running reader (the API): a new one costs more than most
    questions (the password exchange alone is about 10 ms). One that failed mid-question is closed, not kept."""

    def __init__(self, url: str, *, keep: int = 4) -> None:
        self.url = url
        self.keep = keep
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    @contextmanager
    def connection(self, wait_s: float) -> Iterator[PostgresConnection]:
        with self._lock:
            raw = self._idle.pop() if self._idle else None
        if raw is None or raw.closed:
            raw = _open(self.url, wait_s)
            raw.execute("SET default_transaction_read_only = on")
        try:
            yield PostgresConnection(raw)
        except BaseException:
            raw.close()
            raise
        with self._lock:
            if len(self._idle) < self.keep and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                self._idle.append(raw)
                return
        raw.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for raw in idle:
            raw.close()


def _first_line(err: BaseException, url: str) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.replace(url, redact(url))


def primary_key(con: PostgresConnection, table: str) -> list[str]:
    rows = con.raw.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
        [table],
    ).fetchall()
    return [r[0] for r in rows]


RETRIES = 5


def _as_csv(batch: pa.Table) -> bytes:
    """The batch as COPY's CSV, written by Arrow in C++ (a Python loop over rows costs more than the insert): times
    in UTC with a ``Z``, an empty field for NULL, strings quoted (so an empty string stays one)."""
    sink = io.BytesIO()
    csv.write_csv(batch, sink, csv.WriteOptions(include_header=False, quoting_style="needed"))
    return sink.getvalue()


def insert_table(
    con: PostgresConnection,
    table: str,
    batch: pa.Table,
    *,
    replace: bool,
    after: str | None,
    ledger: Sequence[Sequence[Any]] = (),
) -> int:
    """``batch`` into ``table`` by COPY and one keyed INSERT (``after``: a statement over ``incoming`` to run in the
    same transaction; ``ledger``: the Kafka positions these rows account for, :data:`precursor.store.ledger.
    LEDGER_INSERT` rows, in the same transaction too); returns the rows that were new (or replaced). Two writers whose
    rows meet retry on deadlock."""
    columns = batch.column_names
    listed = ", ".join(columns)
    key = primary_key(con, table)
    order = ", ".join(key)
    if replace:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        conflict = f"ON CONFLICT ({order}) DO UPDATE SET {updates}" if updates else "ON CONFLICT DO NOTHING"
        source = f"SELECT DISTINCT ON ({order}) {listed} FROM incoming ORDER BY {order}"
    else:
        conflict = "ON CONFLICT DO NOTHING"
        # In key order, so two writers take their row locks in one order.
        source = f"SELECT {listed} FROM incoming ORDER BY {order}"
    text = _as_csv(batch)
    for attempt in range(RETRIES):
        try:
            with con.raw.transaction():
                con.raw.execute(
                    f"CREATE TEMP TABLE incoming ON COMMIT DROP AS SELECT {listed} FROM {table} WITH NO DATA"
                )
                with con.raw.cursor().copy(f"COPY incoming ({listed}) FROM STDIN (FORMAT csv)") as copy:
                    copy.write(text)
                written = con.raw.execute(f"INSERT INTO {table} ({listed}) {source} {conflict}").rowcount
                if after is not None:
                    con.execute(after)
                if ledger:
                    con.executemany(LEDGER_INSERT, ledger)
            return max(written, 0)
        except (errors.DeadlockDetected, errors.SerializationFailure):
            if attempt == RETRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    return 0


_ARROW_TYPES = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    25: pa.string(),
    700: pa.float32(),
    701: pa.float64(),
    1043: pa.string(),
}
"""Arrow types of the PostgreSQL types (by OID) that a snapshot query selects."""


def read_consistent(con: PostgresConnection, queries: Sequence[str]) -> list[pa.Table]:
    """Each query's rows as an Arrow table, all read from one snapshot of the database (as writers go on)."""
    tables = []
    with con.raw.transaction():
        con.raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for query in queries:
            cur = con.execute(query)
            rows = cur.fetchall()
            columns = list(zip(*rows, strict=True)) if rows else [() for _ in cur.description]
            tables.append(
                pa.table(
                    {
                        d.name: pa.array(list(values), type=_ARROW_TYPES.get(d.type_code))
                        for d, values in zip(cur.description, columns, strict=True)
                    }
                )
            )
    return tables
