"""The questions people ask of the store, without SQL. Each returns plain rows (dicts) for any front end.

Open a :class:`StoreReader` with :func:`reading` and ask it as many questions as a page needs over one read-only
connection; the module-level :func:`at_risk`, :func:`machine_history` and :func:`counts_per_edge` are one-shot
conveniences. Tables that a store may not have yet (alerts, heartbeats, telemetry summaries, model metrics) read as
empty, so a young store answers every question.

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
>>> check_read_only_sql("DELETE FROM predictions")
Traceback (most recent call last):
...
store.queries.SqlRejected: only a single SELECT (or WITH ... SELECT) statement may run here; got DELETE
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import duckdb

from contracts.alerting import DEFAULT_THRESHOLD, AlertRule
from contracts.durations import parse_duration
from contracts.formats import parse_timestamp
from contracts.outcomes import ANY_FAILURE
from contracts.versions import version_key
from store.db import StoreBusy, connect
from store.location import StoreLocation, is_postgres, redact

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
    parameters: ``fixed`` where the caller asks at one figure, else the alerts' rule (:mod:`contracts.alerting`)."""
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


class StoreReader:
    """Answers over one open read-only connection. Build it with :func:`reading`."""

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

    # -- machines ----------------------------------------------------------------------------------------------

    def machine_exists(self, machine_id: str) -> bool:
        """Whether the store has any prediction or event of this machine."""
        if self._latest_kept is not False and self._has_rows("latest_predictions"):
            found = self.con.execute("SELECT 1 FROM latest_predictions WHERE machine_id = ?", [machine_id]).fetchone()
            if found:
                return True
        for table in ("predictions", "events"):
            if self.con.execute(f"SELECT 1 FROM {table} WHERE machine_id = ? LIMIT 1", [machine_id]).fetchone():
                return True
        return False

    def at_risk(
        self,
        *,
        limit: int = 10,
        offset: int = 0,
        since: datetime | None = None,
        min_risk: float | None = None,
        edge_id: str | None = None,
        model_version: str | None = None,
        kind: str | None = None,
        threshold: float | None = None,
        rule: AlertRule | None = None,
    ) -> Page:
        """Each machine's latest prediction, riskiest first: what is at risk now, why (risk per kind), and since
        when (``elevated_since``: the start of its current run of windows at or above the threshold, looked for up
        to :data:`ELEVATED_LOOKBACK` back) and any alert still raised.

        Each row is judged at ``threshold`` where one is given, else at its model's operating point under ``rule``
        (the alerts' rule): ``threshold`` says which figure, ``band`` where its risk lies against it (``high`` is at
        risk, ``elevated`` is in the hysteresis gap, ``low`` below the clear level)."""
        rule = rule or AlertRule()
        point, point_params = _operating_point("latest", rule, threshold)
        where = _Where()
        where.maybe("window_end >= ?", since)
        where.maybe("max_risk >= ?", min_risk)
        where.maybe("edge_id = ?", edge_id)
        where.maybe("model_version = ?", model_version)
        where.maybe("top_kind = ?", kind)
        rows = self.rows(
            f"""
            SELECT machine_id, max_risk, top_kind, risk, window_start, window_end, horizon_h,
                   model_name, model_version, edge_id, seq, {point} AS threshold, count(*) OVER () AS total
            FROM {self._latest} AS latest
            {where.sql}
            ORDER BY max_risk DESC, machine_id
            LIMIT ? OFFSET ?
            """,
            [*point_params, *where.params, limit, offset],
        )
        if rows:
            total = int(rows[0]["total"])
        else:
            found = self.con.execute(f"SELECT count(*) FROM {self._latest} AS latest {where.sql}", where.params)
            total = int(found.fetchone()[0])  # type: ignore[index]
        for row in rows:
            del row["total"]
            row["band"] = rule.band(row["max_risk"], row["threshold"])
            row["at_risk"] = row["band"] == "high"
        self._add_elevated_since(rows, rule, threshold)
        self._add_open_alerts(rows)
        return Page(rows, total, limit, offset)

    def _add_elevated_since(self, rows: list[dict[str, Any]], rule: AlertRule, threshold: float | None) -> None:
        risky = [r for r in rows if r["at_risk"]]
        for row in rows:
            row["elevated_since"] = None
        if not risky:
            return
        # Each earlier window is judged at its own operating point, as the alerts judged it.
        point, point_params = _operating_point("p", rule, threshold)
        # One bound for the whole page keeps the scan to the newest row groups (the table is in arrival order).
        start = min(r["window_end"] for r in risky) - ELEVATED_LOOKBACK
        found = self.con.execute(
            f"""
            WITH recent AS (
                SELECT machine_id, window_end, max_risk >= {point} AS risky FROM predictions AS p
                WHERE window_end >= ? AND machine_id IN (SELECT unnest(?::VARCHAR[]))
            ),
            calm AS (SELECT machine_id, max(window_end) AS last_calm FROM recent WHERE NOT risky GROUP BY machine_id)
            SELECT r.machine_id, min(r.window_end)
            FROM recent r LEFT JOIN calm c USING (machine_id)
            WHERE r.risky AND (c.last_calm IS NULL OR r.window_end > c.last_calm)
            GROUP BY r.machine_id
            """,
            [*point_params, start, [r["machine_id"] for r in risky]],
        ).fetchall()
        since = dict(found)
        for row in risky:
            row["elevated_since"] = since.get(row["machine_id"])

    def _add_open_alerts(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            row["open_alerts"] = []
        if not rows or not self.has_table("alerts"):
            return
        found = self.rows(
            """
            SELECT machine_id, kind, ts AS raised_at, risk FROM alerts
            WHERE machine_id IN (SELECT unnest(?::VARCHAR[]))
            QUALIFY row_number() OVER (PARTITION BY machine_id, kind ORDER BY ts DESC, state = 'cleared' DESC) = 1
                AND state = 'raised'
            ORDER BY raised_at
            """,
            [[r["machine_id"] for r in rows]],
        )
        by_machine: dict[str, list[dict[str, Any]]] = {}
        for alert in found:
            machine = alert.pop("machine_id")
            by_machine.setdefault(machine, []).append(alert)
        for row in rows:
            row["open_alerts"] = by_machine.get(row["machine_id"], [])

    def fleet_summary(self, threshold: float | None = None, rule: AlertRule | None = None) -> dict[str, Any]:
        """Machines, how many are at risk, edges, open alerts, and the newest window: the dashboard's header.

        At risk: latest risk at or above ``threshold`` where one is given, else at the machine's operating point
        under ``rule`` (the alerts' rule, returned as ``operating_point`` so a page judges live predictions alike)."""
        rule = rule or AlertRule()
        point, point_params = _operating_point("latest", rule, threshold)
        latest = self.con.execute(
            f"""
            SELECT count(*), count(*) FILTER (WHERE max_risk >= {point}), count(DISTINCT edge_id), max(window_end),
                   count(DISTINCT model_version)
            FROM {self._latest} AS latest
            """,
            point_params,
        ).fetchone()
        machines, at_risk, edges, newest, versions = latest if latest else (0, 0, 0, None, 0)
        open_alerts = 0
        if self.has_table("alerts"):
            row = self.con.execute(
                """
                SELECT count(*) FROM (
                    SELECT state FROM alerts
                    QUALIFY row_number() OVER (PARTITION BY machine_id, kind ORDER BY ts DESC,
                                               state = 'cleared' DESC) = 1
                ) WHERE state = 'raised'
                """
            ).fetchone()
            open_alerts = int(row[0]) if row else 0
        return {
            "machines": int(machines),
            "at_risk": int(at_risk),
            "threshold": threshold,
            "operating_point": rule.model_dump(
                include={"default_threshold", "threshold", "model_thresholds", "clear_factor"}
            ),
            "edges": int(edges),
            "model_versions": int(versions),
            "open_alerts": open_alerts,
            "newest_window_end": newest,
        }

    def operating_point(self, machine_id: str, rule: AlertRule | None = None) -> float:
        """The threshold the machine's latest prediction is judged at under ``rule``: what its alerts follow."""
        rule = rule or AlertRule()
        point, params = _operating_point("latest", rule, None)
        found = self.con.execute(
            f"SELECT {point} FROM {self._latest} AS latest WHERE machine_id = ?", [*params, machine_id]
        ).fetchone()
        return float(found[0]) if found else rule.threshold_for("", None)

    def machine_summary(self, machine_id: str) -> dict[str, Any] | None:
        """What the store knows of one machine, or ``None`` if it knows nothing."""
        counts = self.rows(
            """
            SELECT count(*) AS predictions, min(window_end) AS first_window_end, max(window_end) AS last_window_end,
                   list(DISTINCT edge_id ORDER BY edge_id) AS edges,
                   list(DISTINCT model_version ORDER BY model_version) AS model_versions
            FROM predictions WHERE machine_id = ?
            """,
            [machine_id],
        )[0]
        events = self.rows(
            "SELECT kind, count(*) AS n FROM events WHERE machine_id = ? GROUP BY kind ORDER BY kind", [machine_id]
        )
        if counts["predictions"] == 0 and not events:
            return None
        latest = self.rows(
            f"""
            SELECT machine_id, max_risk, top_kind, risk, window_start, window_end, horizon_h, model_name,
                   model_version, edge_id, seq, {self._reasons()}
            FROM predictions WHERE machine_id = ? ORDER BY window_end DESC, seq DESC LIMIT 1
            """,
            [machine_id],
        )
        return {
            "machine_id": machine_id,
            **counts,
            "events": {e["kind"]: int(e["n"]) for e in events},
            "latest": latest[0] if latest else None,
        }

    def machine_history(
        self,
        machine_id: str,
        *,
        limit: int = 100,
        offset: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Page:
        """One machine's predictions, newest first."""
        where = _Where()
        where.add("machine_id = ?", machine_id)
        where.maybe("window_end >= ?", since)
        where.maybe("window_end <= ?", until)
        total_row = self.con.execute(f"SELECT count(*) FROM predictions {where.sql}", where.params).fetchone()
        rows = self.rows(
            f"""
            SELECT window_start, window_end, max_risk, top_kind, risk, horizon_h, model_name, model_version,
                   edge_id, seq, {self._reasons()}
            FROM predictions {where.sql}
            ORDER BY window_end DESC, seq DESC
            LIMIT ? OFFSET ?
            """,
            [*where.params, limit, offset],
        )
        return Page(rows, int(total_row[0]) if total_row else 0, limit, offset)

    def risk_series(
        self, machine_id: str, *, since: datetime | None = None, until: datetime | None = None, points: int = 500
    ) -> list[dict[str, Any]]:
        """Predicted risk over time, at most ``points`` points: the peak of each time bucket, so no spike is lost."""
        where = _Where()
        where.add("machine_id = ?", machine_id)
        where.maybe("window_end >= ?", since)
        where.maybe("window_end <= ?", until)
        return self.rows(
            f"""
            WITH m AS (SELECT window_end, max_risk, top_kind FROM predictions {where.sql}),
            span AS (SELECT min(epoch_us(window_end)) AS lo, max(epoch_us(window_end)) AS hi FROM m)
            SELECT max(window_end) AS t, max(max_risk) AS risk, avg(max_risk) AS risk_mean,
                   arg_max(top_kind, max_risk) AS top_kind, count(*) AS windows
            FROM m, span
            GROUP BY floor((epoch_us(window_end) - lo) * ? / greatest(hi - lo + 1, 1))
            ORDER BY t
            """,
            [*where.params, points],
        )

    def machine_events(
        self,
        machine_id: str | None = None,
        *,
        kinds: Sequence[str] | None = None,
        limit: int = 100,
        offset: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Page:
        """Events (failures, maintenance, error codes, anomalies), newest first."""
        where = _Where()
        where.maybe("machine_id = ?", machine_id)
        where.maybe("ts >= ?", since)
        where.maybe("ts <= ?", until)
        if kinds:
            where.add("kind IN (SELECT unnest(?::VARCHAR[]))", list(kinds))
        return self._page(
            f"SELECT machine_id, ts, event, kind, detail, edge_id, seq FROM events {where.sql}",
            where.params,
            "ts DESC, machine_id, seq DESC",
            limit,
            offset,
        )

    def failures(
        self,
        machine_id: str | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> Page:
        """Failures, newest first, each with how well it was foreseen: ``warned_at`` is the first window at or above
        ``threshold`` whose horizon covered the failure (after any earlier failure), ``lead_time_h`` how long before
        the failure that was, ``peak_risk`` the highest risk predicted for it."""
        machine_filter = "AND machine_id = ?" if machine_id else ""
        where = _Where()
        where.maybe("failed_at >= ?", since)
        where.maybe("failed_at <= ?", until)
        # The previous failure is looked up before the time filter, so the first failure in range still knows it.
        page = self._page(
            f"""
            SELECT * FROM (
                SELECT machine_id, ts AS failed_at, coalesce(detail, 'failure') AS failure_kind, event,
                       lag(ts) OVER (PARTITION BY machine_id ORDER BY ts) AS previous_failure_at
                FROM events WHERE kind = 'failure' {machine_filter}
            ) {where.sql}
            """,
            [*([machine_id] if machine_id else []), *where.params],
            "failed_at DESC, machine_id",
            limit,
            offset,
        )
        if not page.rows:
            return page
        foreseen = self.con.execute(
            f"""
            WITH f AS (
                SELECT unnest(?::VARCHAR[]) AS machine_id, unnest(?::TIMESTAMPTZ[]) AS failed_at,
                       unnest(?::TIMESTAMPTZ[]) AS previous_at
            ),
            p AS (
                SELECT machine_id, window_end, max_risk, model_version, {_horizon("predictions")} AS horizon
                FROM predictions
                WHERE machine_id IN (SELECT machine_id FROM f)
                  AND window_end >= (SELECT min(failed_at) FROM f) - INTERVAL 366 DAY
                  AND window_end < (SELECT max(failed_at) FROM f)
            )
            SELECT f.machine_id, f.failed_at,
                   min(p.window_end) FILTER (WHERE p.max_risk >= ?) AS warned_at,
                   max(p.max_risk) AS peak_risk, count(p.window_end) AS windows_before,
                   arg_max(p.model_version, p.window_end) AS model_version
            FROM f LEFT JOIN p ON p.machine_id = f.machine_id AND p.window_end < f.failed_at
                AND p.window_end >= f.failed_at - p.horizon
                AND (f.previous_at IS NULL OR p.window_end > f.previous_at)
            GROUP BY ALL
            """,
            [
                [r["machine_id"] for r in page.rows],
                [r["failed_at"] for r in page.rows],
                [r["previous_failure_at"] for r in page.rows],
                threshold,
            ],
        ).fetchall()
        by_key = {(m, t): rest for m, t, *rest in foreseen}
        for row in page.rows:
            warned, peak, windows, version = by_key.get((row["machine_id"], row["failed_at"]), (None, None, 0, None))
            row["model_version"] = version
            row["warned_at"] = warned
            row["lead_time_h"] = (row["failed_at"] - warned).total_seconds() / 3600 if warned else None
            row["peak_risk"] = peak
            row["windows_before"] = int(windows)
            row["caught"] = warned is not None
            row["threshold"] = threshold
        return page

    def telemetry_series(
        self,
        machine_id: str,
        *,
        sensors: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        points: int = 300,
    ) -> dict[str, list[dict[str, Any]]]:
        """sensor -> summary points (mean, min, max, last) over time, at most ``points`` per sensor; empty where the
        store holds no telemetry summaries (raw telemetry stays at the edge unless a site opts in). Where the
        summaries are more than ``points``, each point merges several: their mean, lowest, highest and latest."""
        if not self.has_table("telemetry_summaries"):
            return {}
        where = _Where()
        where.add("machine_id = ?", machine_id)
        where.maybe("window_end >= ?", since)
        where.maybe("window_end <= ?", until)
        if sensors:
            where.add("sensor IN (SELECT unnest(?::VARCHAR[]))", list(sensors))
        rows = self.rows(
            f"""
            WITH m AS (SELECT * FROM telemetry_summaries {where.sql}),
            span AS (SELECT min(epoch_us(window_end)) AS lo, max(epoch_us(window_end)) AS hi FROM m)
            SELECT sensor, max(window_end) AS t, sum(value_mean * samples) / sum(samples) AS mean,
                   min(value_min) AS min, max(value_max) AS max, arg_max(value_last, window_end) AS last,
                   sum(samples) AS samples
            FROM m, span
            GROUP BY sensor, floor((epoch_us(window_end) - lo) * ? / greatest(hi - lo + 1, 1))
            ORDER BY sensor, t
            """,
            [*where.params, points],
        )
        series: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            series.setdefault(row.pop("sensor"), []).append(row)
        return series

    # -- alerts ------------------------------------------------------------------------------------------------

    def alerts(
        self,
        *,
        machine_id: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> Page:
        """Alerts raised and cleared by the pipelines, newest first; an empty page where none are stored yet."""
        if not self.has_table("alerts"):
            return Page([], 0, limit, offset)
        where = _Where()
        where.maybe("machine_id = ?", machine_id)
        where.maybe("state = ?", state)
        where.maybe("kind = ?", kind)
        where.maybe("ts >= ?", since)
        where.maybe("ts <= ?", until)
        page = self._page(
            f'SELECT machine_id, kind, state, ts AS "at", risk, model_version FROM alerts {where.sql}',
            where.params,
            '"at" DESC, machine_id, kind',
            limit,
            offset,
        )
        self._add_alert_reasons(page.rows)
        return page

    def _add_alert_reasons(self, rows: list[dict[str, Any]]) -> None:
        """Each alert's ``reasons``: those of the prediction that decided it (its machine, window end and model
        version; the newest such where edges sent several), looked up for the page's alerts only."""
        for row in rows:
            row["reasons"] = None
        if not rows or self._reasons() != "reasons":
            return
        found = self.con.execute(
            """
            WITH a AS (
                SELECT unnest(?::VARCHAR[]) AS machine_id, unnest(?::TIMESTAMPTZ[]) AS ts,
                       unnest(?::VARCHAR[]) AS model_version
            )
            SELECT a.machine_id, a.ts, a.model_version, arg_max(p.reasons, p.seq)::VARCHAR
            FROM a JOIN predictions AS p
              ON p.machine_id = a.machine_id AND p.window_end = a.ts AND p.model_version = a.model_version
            WHERE p.reasons IS NOT NULL
            GROUP BY ALL
            """,
            [[r["machine_id"] for r in rows], [r["at"] for r in rows], [r["model_version"] for r in rows]],
        ).fetchall()
        by_key = {(m, t, v): json.loads(reasons) for m, t, v, reasons in found}
        for row in rows:
            row["reasons"] = by_key.get((row["machine_id"], row["at"], row["model_version"]))

    # -- models ------------------------------------------------------------------------------------------------

    def model_versions(
        self, *, edge_id: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Which model versions each edge ran: predictions, machines, and the first and last window of each."""
        where = _Where()
        where.maybe("edge_id = ?", edge_id)
        where.maybe("window_end >= ?", since)
        where.maybe("window_end <= ?", until)
        return self.rows(
            f"""
            SELECT edge_id, model_name, model_version, count(*) AS predictions,
                   count(DISTINCT machine_id) AS machines,
                   min(window_end) AS first_window_end, max(window_end) AS last_window_end
            FROM predictions {where.sql}
            GROUP BY ALL
            ORDER BY edge_id, first_window_end, model_version
            """,
            where.params,
        )

    def rollout(self) -> list[dict[str, Any]]:
        """Per edge: the model its machines' latest predictions came from, what its newest heartbeat reports, and
        whether it runs the fleet's newest version (``current``), some of it (``rolling``) or none (``behind``);
        ``identity`` says whether its heartbeats prove who sent them (see :func:`_identity`)."""
        versions = self.rows(
            f"""
            SELECT edge_id, model_name, model_version, count(*) AS machines, max(window_end) AS last_window_end
            FROM {self._latest} AS latest
            GROUP BY ALL ORDER BY edge_id, model_version
            """
        )
        beats: dict[str, dict[str, Any]] = {}
        trust: dict[str, dict[str, Any]] = {}
        if self.has_table("heartbeats"):
            # A forged heartbeat says nothing true about the edge it names: the newest one it did send is shown.
            for beat in self.rows(
                f"""
                SELECT edge_id, ts AS heartbeat_at, model_name, model_version, model_sha256, outbox_depth, lag_s,
                       health, machines, trust, model_known, agent_version, agent_sha256, key_id
                FROM {self._heartbeats} WHERE trust <> 'forged'
                QUALIFY row_number() OVER (PARTITION BY edge_id ORDER BY ts DESC, seq DESC) = 1
                """
            ):
                beats[beat.pop("edge_id")] = beat
            for counts in self.rows(
                f"""
                SELECT edge_id, count(*) FILTER (trust = 'verified') AS verified,
                       count(*) FILTER (trust = 'unsigned') AS unsigned, count(*) FILTER (trust = 'forged') AS forged,
                       max(ingested_at) FILTER (trust = 'forged') AS last_forged_at,
                       arg_max(trust_reason, ingested_at) FILTER (trust = 'forged') AS last_forged_reason
                FROM {self._heartbeats} GROUP BY edge_id
                """
            ):
                trust[counts.pop("edge_id")] = counts
        known = {v["model_version"] for v in versions} | {b["model_version"] for b in beats.values()}
        newest = max(known, key=version_key) if known else None
        edges: dict[str, dict[str, Any]] = {}
        for v in versions:
            edge = edges.setdefault(
                v["edge_id"], {"edge_id": v["edge_id"], "machines": 0, "versions": [], "last_window_end": None}
            )
            edge["machines"] += int(v["machines"])
            edge["versions"].append(
                {"model_name": v["model_name"], "model_version": v["model_version"], "machines": int(v["machines"])}
            )
            last = edge["last_window_end"]
            edge["last_window_end"] = v["last_window_end"] if last is None else max(last, v["last_window_end"])
        for edge_id in beats.keys() | trust.keys():
            edges.setdefault(edge_id, {"edge_id": edge_id, "machines": 0, "versions": [], "last_window_end": None})
        out = []
        for edge_id in sorted(edges):
            edge = edges[edge_id]
            beat = beats.get(edge_id)
            on_newest = sum(v["machines"] for v in edge["versions"] if v["model_version"] == newest)
            running = beat["model_version"] if beat else None
            if edge["machines"] and on_newest == edge["machines"] and running in (None, newest):
                status = "current"
            elif on_newest or running == newest:
                status = "rolling"
            else:
                status = "behind"
            out.append(
                {
                    **edge,
                    "running_version": running or _majority(edge["versions"]),
                    "newest_version": newest,
                    "on_newest": on_newest,
                    "status": status,
                    "heartbeat": beat,
                    "identity": _identity(beat, trust.get(edge_id)),
                }
            )
        return out

    @property
    def _heartbeats(self) -> str:
        """The heartbeats table, read alike from a store written before heartbeats were judged (until a writer opens
        it and migrates it, its rows read as unsigned)."""
        judged = self.con.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_catalog = current_database() "
            "AND table_schema = current_schema() AND table_name = 'heartbeats' AND column_name = 'trust'"
        ).fetchone()
        if judged:
            return "heartbeats"
        return (
            "(SELECT *, 'unsigned' AS trust, NULL::VARCHAR AS trust_reason, NULL::BOOLEAN AS model_known, "
            "NULL::VARCHAR AS agent_version, NULL::VARCHAR AS agent_sha256, NULL::VARCHAR AS key_id FROM heartbeats)"
        )

    def quality(
        self,
        *,
        bucket: timedelta = timedelta(days=1),
        threshold: float = DEFAULT_THRESHOLD,
        model_version: str | None = None,
        kind: str = ANY_FAILURE,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Precision and recall per model version over time.

        Where the monitoring pipeline has written ``model_metrics``, its figures for failure ``kind`` (``failure``:
        any failure), in its own windows (``bucket`` does not apply). Otherwise computed here for any failure, per
        ``bucket``: a window is a true failure if its machine failed within the horizon after it, and predicted one
        if its risk is at or above ``threshold``; windows whose horizon has not yet passed (by the newest event or
        prediction stored) have no outcome yet and are left out."""
        if self._has_rows("model_metrics"):
            where = _Where()
            where.add("kind = ?", kind)
            where.maybe("model_version = ?", model_version)
            where.maybe("window_end >= ?", since)
            where.maybe("window_start <= ?", until)
            return self.rows(
                f"""
                SELECT model_name, model_version, window_start AS bucket_start, window_end AS bucket_end,
                       examples AS windows, tp, fp, fn, tn, precision, recall, failures, failures_caught,
                       mean_lead_time_h, threshold, 'model_metrics' AS source
                FROM model_metrics {where.sql}
                ORDER BY model_version, bucket_start, bucket_end
                """,
                where.params,
            )
        rows = self._computed_quality(bucket, threshold, model_version, since, until)
        width = bucket.total_seconds()
        stats: dict[tuple[str, datetime], list[dict[str, Any]]] = {}
        for failure in self.failures(threshold=threshold, since=since, until=until, limit=1_000_000).rows:
            if failure["model_version"] is None:
                continue
            for row in rows:
                if row["model_version"] == failure["model_version"] and (
                    row["bucket_start"] <= failure["failed_at"] < row["bucket_start"] + timedelta(seconds=width)
                ):
                    stats.setdefault((row["model_version"], row["bucket_start"]), []).append(failure)
                    break
        for row in rows:
            seen = stats.get((row["model_version"], row["bucket_start"]), [])
            leads = [f["lead_time_h"] for f in seen if f["lead_time_h"] is not None]
            row["failures"] = len(seen)
            row["failures_caught"] = len(leads)
            row["mean_lead_time_h"] = sum(leads) / len(leads) if leads else None
        return rows

    def _computed_quality(
        self,
        bucket: timedelta,
        threshold: float,
        model_version: str | None,
        since: datetime | None,
        until: datetime | None,
    ) -> list[dict[str, Any]]:
        where = _Where()
        where.maybe("p.model_version = ?", model_version)
        where.maybe("p.window_end >= ?", since)
        where.maybe("p.window_end <= ?", until)
        where.add(f"p.window_end + {_horizon('p')} <= (SELECT newest FROM observed)")
        width_us = int(bucket.total_seconds() * 1_000_000)
        return self.rows(
            f"""
            WITH observed AS (
                SELECT greatest((SELECT max(window_end) FROM predictions), (SELECT max(ts) FROM events)) AS newest
            ),
            f AS (SELECT machine_id, ts FROM events WHERE kind = 'failure'),
            p AS (
                SELECT p.machine_id, p.window_end, p.max_risk, p.model_name, p.model_version, {_horizon("p")} AS horizon
                FROM predictions p {where.sql}
            ),
            labelled AS (
                SELECT p.*, EXISTS (
                    SELECT 1 FROM f WHERE f.machine_id = p.machine_id AND f.ts > p.window_end
                                      AND f.ts <= p.window_end + p.horizon
                ) AS failed
                FROM p
            )
            SELECT model_name, model_version,
                   time_bucket(to_microseconds(?::BIGINT), window_end) AS bucket_start,
                   time_bucket(to_microseconds(?::BIGINT), window_end) + to_microseconds(?::BIGINT) AS bucket_end,
                   count(*) AS windows,
                   count(*) FILTER (WHERE failed AND max_risk >= ?) AS tp,
                   count(*) FILTER (WHERE NOT failed AND max_risk >= ?) AS fp,
                   count(*) FILTER (WHERE failed AND max_risk < ?) AS fn,
                   count(*) FILTER (WHERE NOT failed AND max_risk < ?) AS tn,
                   tp / nullif(tp + fp, 0) AS precision,
                   tp / nullif(tp + fn, 0) AS recall,
                   NULL::BIGINT AS failures, NULL::BIGINT AS failures_caught, NULL::DOUBLE AS mean_lead_time_h,
                   ?::DOUBLE AS threshold, 'computed' AS source
            FROM labelled
            GROUP BY ALL
            ORDER BY model_version, bucket_start
            """,
            [*where.params, width_us, width_us, width_us, threshold, threshold, threshold, threshold, threshold],
        )

    def counts_per_edge(self) -> list[dict[str, Any]]:
        """How many predictions each edge sent, over how many machines, and when it was last heard of."""
        return self.rows(
            """
            SELECT edge_id, count(*) AS predictions, count(DISTINCT machine_id) AS machines,
                   max(window_end) AS latest_window_end, max(seq) AS max_seq
            FROM predictions
            GROUP BY edge_id
            ORDER BY edge_id
            """
        )

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


def _error_kinds(con: object) -> tuple[tuple[type[BaseException], ...], ...]:
    """What ``con`` raises for a statement that was stopped, for a store in trouble, and for a statement at fault."""
    interrupted: tuple[type[BaseException], ...] = (duckdb.InterruptException,)
    trouble: tuple[type[BaseException], ...] = (duckdb.IOException, duckdb.ConnectionException, duckdb.FatalException)
    failed: tuple[type[BaseException], ...] = (duckdb.Error,)
    postgres = sys.modules.get("store.postgres")  # not loaded: no PostgreSQL connection can exist
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


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _identity(beat: dict[str, Any] | None, counts: dict[str, Any] | None) -> dict[str, Any]:
    """Whether an edge proves who it is: heartbeats per trust state, and what deserves a look (``flags``): forged
    heartbeats in its name, its newest heartbeat unsigned, or a model that is no known release."""
    counts = counts or {"verified": 0, "unsigned": 0, "forged": 0, "last_forged_at": None, "last_forged_reason": None}
    flags = []
    if counts["forged"]:
        flags.append("forged")
    if beat is not None and beat["trust"] == "unsigned":
        flags.append("unsigned")
    unknown_model = beat is not None and beat["model_known"] is False
    if unknown_model:
        flags.append("unknown_model")
    return {
        "trust": beat["trust"] if beat else None,
        **{k: int(counts[k]) for k in ("verified", "unsigned", "forged")},
        "last_forged_at": counts["last_forged_at"],
        "last_forged_reason": counts["last_forged_reason"],
        "unknown_model": unknown_model,
        "flags": flags,
    }


def _majority(versions: list[dict[str, Any]]) -> str | None:
    return max(versions, key=lambda v: v["machines"])["model_version"] if versions else None


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
        from store.postgres import ReadPool  # psycopg and sqlglot: only for a PostgreSQL store

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
