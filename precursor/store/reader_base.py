"""What every question of the store is built on: the open read-only connection and its plumbing (which tables a
store has, rows as plain values, each machine's newest prediction, pages), time ranges, filters, and the alerts'
operating point in SQL. The questions live by what they ask about, and :class:`precursor.store.queries.StoreReader`
answers
them all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any
from uuid import UUID

import duckdb

from precursor.contracts.alerting import AlertRule
from precursor.contracts.durations import parse_duration
from precursor.contracts.formats import parse_timestamp

ELEVATED_LOOKBACK = timedelta(days=7)
"""How far back "at risk since" looks for the start of a machine's current run of risky windows."""

READ_ONLY_SESSION = {False: "SET enable_external_access = false", True: "SET default_transaction_read_only = on"}
"""How :func:`reading` closes a session to everything but reading the store, per backend (key: PostgreSQL)."""

MAX_SQL_CHARS = 20_000
MAX_SQL_ROWS = 10_000


class SqlRejected(ValueError):
    """Raw SQL that may not run here: not a single read-only statement, invalid, or over a limit."""


MAX_SQL_BYTES = 8 * 1024 * 1024
"""About the most bytes of values one raw SQL answer carries: the row limit alone lets a few huge rows through."""


@dataclass
class _Fetched:
    rows: list[tuple[Any, ...]]
    cut: bool  # stopped at the byte limit with rows left


def _value_bytes(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple | dict):
        return len(repr(value))
    return 16


def _fetch_within(cur: duckdb.DuckDBPyConnection, rows: int, max_bytes: int) -> _Fetched:
    """Up to ``rows`` rows, a row at a time, stopping before the values pass ``max_bytes``."""
    out: list[tuple[Any, ...]] = []
    total = 0
    while len(out) < rows:
        row = cur.fetchone()
        if row is None:
            return _Fetched(out, cut=False)
        total += sum(_value_bytes(v) for v in row)
        if total > max_bytes:
            if not out:
                raise SqlRejected(f"the answer's first row alone is larger than the {max_bytes:,}-byte limit")
            return _Fetched(out, cut=True)
        out.append(row)
    return _Fetched(out, cut=False)


# -- time ranges ------------------------------------------------------------------------------------------------


def parse_time_bound(text: str, *, now: datetime | None = None, name: str = "time") -> datetime:
    """``6h`` (that long before ``now``), ``now``, or a time (ISO 8601, a date, or epoch seconds), as UTC."""
    now = now or datetime.now(UTC)
    value = text.strip()
    if value.lower() == "now":
        return now
    try:
        return now - parse_duration(value)
    except (ValueError, OverflowError):
        pass
    try:
        return parse_timestamp(value)
    except (ValueError, OverflowError, OSError):
        pass
    raise ValueError(
        f"{name}={text!r} is neither a duration back from now (30m, 6h, 7d) nor a time (2026-01-01T00:00Z)"
    )


def check_range(since: datetime | None, until: datetime | None) -> None:
    """Refuse a range that ends before it starts."""
    if since is not None and until is not None and since > until:
        raise ValueError(f"since={since.isoformat()} is after until={until.isoformat()}: the range is empty")


# -- plain values -----------------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """A value from DuckDB as something JSON can carry (times stay datetimes; the front ends format them)."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, date | time_of_day) and not isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _risk(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Page:
    """One page of rows, and how many rows match in all."""

    rows: list[dict[str, Any]]
    total: int
    limit: int
    offset: int


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    elapsed_ms: float


@dataclass
class _Where:
    """A WHERE clause built from optional filters, with its parameters in order."""

    clauses: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)

    def add(self, clause: str, *params: Any) -> None:
        self.clauses.append(clause)
        self.params.extend(params)

    def maybe(self, clause: str, value: Any) -> None:
        if value is not None:
            self.add(clause, value)

    def within(self, column: str, since: datetime | None, until: datetime | None) -> _Where:
        """``column`` from ``since`` to ``until``, both included; an end left at None is open."""
        self.maybe(f"{column} >= ?", since)
        self.maybe(f"{column} <= ?", until)
        return self

    @property
    def sql(self) -> str:
        return ("WHERE " + " AND ".join(self.clauses)) if self.clauses else ""


# Two steps: each machine's newest window end (a small aggregate), then only the rows at those ends. The join's
# dynamic filter on window_end skips every older row group (the table is in arrival order), so this reads little
# more than the newest data: 0.1 s over 10 M rows, where ranking every row with a window function takes over 10 s.
_LATEST_FROM_PREDICTIONS = """
    WITH newest AS (SELECT machine_id, max(window_end) AS window_end FROM predictions GROUP BY machine_id)
    SELECT p.* FROM predictions AS p JOIN newest AS n ON p.machine_id = n.machine_id AND p.window_end = n.window_end
    QUALIFY row_number() OVER (PARTITION BY p.machine_id ORDER BY p.seq DESC) = 1
"""


def _operating_point(table: str, rule: AlertRule, fixed: float | None) -> tuple[str, list[Any]]:
    """SQL for the threshold each row of ``table`` (with ``model_name`` and ``threshold``) is judged at, and its
    parameters: ``fixed`` where the caller asks at one figure, else the alerts' rule
    (:mod:`precursor.contracts.alerting`)."""
    if fixed is not None:
        return "?::DOUBLE", [fixed]
    params: list[Any] = []
    per_model = ""
    if rule.model_thresholds:
        cases = " ".join("WHEN ? THEN ?::DOUBLE" for _ in rule.model_thresholds)
        per_model = f"CASE {table}.model_name {cases} END, "
        params += [v for pair in sorted(rule.model_thresholds.items()) for v in pair]
    params += [rule.threshold, rule.default_threshold]
    return f"coalesce({per_model}?::DOUBLE, {table}.threshold, ?::DOUBLE)", params


def _horizon(table: str) -> str:
    """A prediction's horizon as an INTERVAL."""
    return f"to_microseconds(CAST({table}.horizon_h * 3600e6 AS BIGINT))"


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class ReaderBase:
    """One open read-only connection, and what every question needs of it."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, use_latest_table: bool = True) -> None:
        self.con = con
        self._tables: set[str] | None = None
        # False: derive each machine's latest prediction from all predictions (what a store without the kept table
        # costs; benchmarks compare the two).
        self._latest_kept: bool | None = None if use_latest_table else False
        self._reasons_column: bool | None = None

    # -- plumbing --------------------------------------------------------------------------------------------

    def has_table(self, name: str) -> bool:
        if self._tables is None:
            found = self.con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_catalog = current_database() AND table_schema = current_schema()"
            )
            self._tables = {r[0] for r in found.fetchall()}
        return name in self._tables

    def _reasons(self) -> str:
        """SQL for a prediction's reasons: the column, or NULL in a store written before predictions carried them
        (read-only here, so never migrated by this reader)."""
        if self._reasons_column is None:
            found = self.con.execute(
                "SELECT count(*) FROM information_schema.columns WHERE table_catalog = current_database() "
                "AND table_schema = current_schema() AND table_name = 'predictions' AND column_name = 'reasons'"
            ).fetchone()
            self._reasons_column = bool(found and found[0])
        return "reasons" if self._reasons_column else "NULL::JSON AS reasons"

    def _has_rows(self, table: str) -> bool:
        return self.has_table(table) and self.con.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, list(params))
        names = [d[0] for d in cur.description]
        out = []
        for values in cur.fetchall():
            row = {n: plain(v) for n, v in zip(names, values, strict=True)}
            if "risk" in row and isinstance(row["risk"], str):
                row["risk"] = _risk(row["risk"])
            if isinstance(row.get("reasons"), str):
                row["reasons"] = json.loads(row["reasons"])
            out.append(row)
        return out

    @property
    def _latest(self) -> str:
        """Each machine's newest prediction: the kept table when the writer keeps it, else derived (slower)."""
        if self._latest_kept is None:
            self._latest_kept = self._has_rows("latest_predictions")
        return "latest_predictions" if self._latest_kept else f"({_LATEST_FROM_PREDICTIONS})"

    # -- helpers -----------------------------------------------------------------------------------------------

    def _page(
        self,
        sql: str,
        params: Sequence[Any],
        order: str,
        limit: int,
        offset: int,
    ) -> Page:
        rows = self.rows(
            f"SELECT *, count(*) OVER () AS total FROM ({sql}) ORDER BY {order} LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
        if rows:
            total = int(rows[0]["total"])
        else:
            found = self.con.execute(f"SELECT count(*) FROM ({sql})", list(params)).fetchone()
            total = int(found[0]) if found else 0
        for row in rows:
            row.pop("total", None)
        return Page(rows, total, limit, offset)
