"""Raw SQL, read-only and bounded: one SELECT, at most a number of rows and bytes, and a timeout.

>>> check_read_only_sql("DELETE FROM predictions")
Traceback (most recent call last):
...
precursor.store.reader_base.SqlRejected: only a single SELECT (or WITH ... SELECT) statement may run here; got DELETE
"""

from __future__ import annotations

import re
import sys
import threading
from datetime import UTC, datetime

import duckdb

from precursor.store.reader_base import (
    MAX_SQL_BYTES,
    MAX_SQL_CHARS,
    MAX_SQL_ROWS,
    ReaderBase,
    SqlRejected,
    SqlResult,
    _fetch_within,
    _first_line,
    plain,
)


class SqlQueries(ReaderBase):
    # -- raw SQL -----------------------------------------------------------------------------------------------

    def sql(self, text: str, *, limit: int = 1000, timeout_s: float = 5.0, max_bytes: int = MAX_SQL_BYTES) -> SqlResult:
        """Run one read-only statement; at most ``limit`` rows and about ``max_bytes`` of values come back, and it is
        stopped after ``timeout_s``. An answer cut by either limit says ``truncated``."""
        check_read_only_sql(text)
        if not 1 <= limit <= MAX_SQL_ROWS:
            raise SqlRejected(f"limit={limit} must be between 1 and {MAX_SQL_ROWS}")
        interrupted, trouble, failed = _error_kinds(self.con)
        timer = threading.Timer(timeout_s, self.con.interrupt)
        started = datetime.now(UTC)
        timer.start()
        try:
            cur = self.con.execute(text)
            fetched = _fetch_within(cur, limit + 1, max_bytes)
        except interrupted:
            raise SqlRejected(f"the query ran longer than the {timeout_s:g} s limit and was stopped") from None
        except trouble:
            raise  # the store itself is in trouble, not the statement
        except failed as err:
            # Parser, binder, catalog, conversion, out-of-range, permission (files, network) and the like: all say
            # what is wrong with the statement, so the caller gets DuckDB's own first line.
            raise SqlRejected(_first_line(err)) from None
        finally:
            timer.cancel()
        elapsed = (datetime.now(UTC) - started).total_seconds() * 1000
        description = cur.description or []
        return SqlResult(
            columns=[d[0] for d in description],
            types=[str(d[1]) for d in description],
            rows=[[plain(v) for v in row] for row in fetched.rows[:limit]],
            truncated=len(fetched.rows) > limit or fetched.cut,
            elapsed_ms=elapsed,
        )


def _error_kinds(con: object) -> tuple[tuple[type[BaseException], ...], ...]:
    """What ``con`` raises for a statement that was stopped, for a store in trouble, and for a statement at fault."""
    interrupted: tuple[type[BaseException], ...] = (duckdb.InterruptException,)
    trouble: tuple[type[BaseException], ...] = (duckdb.IOException, duckdb.ConnectionException, duckdb.FatalException)
    failed: tuple[type[BaseException], ...] = (duckdb.Error,)
    postgres = sys.modules.get("precursor.store.postgres")  # not loaded: no PostgreSQL connection can exist
    if postgres is not None and isinstance(con, postgres.PostgresConnection):
        import psycopg
        from sqlglot.errors import SqlglotError

        interrupted += (psycopg.errors.QueryCanceled,)
        trouble += (psycopg.OperationalError,)
        failed += (psycopg.Error, SqlglotError, ValueError)  # ValueError: a text the dialect cannot translate
    return interrupted, trouble, failed


_STATEMENT_NAME = re.compile(r"^StatementType\.")


def check_read_only_sql(text: str) -> None:
    """Refuse anything but one SELECT (``WITH``, ``VALUES``, ``DESCRIBE`` and ``SHOW`` are SELECTs to DuckDB)."""
    if not text or not text.strip():
        raise SqlRejected("the SQL statement is empty")
    if len(text) > MAX_SQL_CHARS:
        raise SqlRejected(f"the SQL statement is {len(text)} characters; at most {MAX_SQL_CHARS} may run")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as err:
        raise SqlRejected(f"the SQL does not parse: {_first_line(err)}") from None
    if len(statements) != 1:
        raise SqlRejected(f"only a single statement may run; got {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise SqlRejected(
            "only a single SELECT (or WITH ... SELECT) statement may run here; got "
            + _STATEMENT_NAME.sub("", str(kind))
        )
