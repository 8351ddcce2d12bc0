"""One machine's questions: whether it exists, its summary, history, risk, events, failures with their lead
times and sensor lines, and alerts with the reasons that raised them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from precursor.contracts.alerting import DEFAULT_THRESHOLD
from precursor.store.reader_base import Page, ReaderBase, _horizon, _Where

# A series of at most ``points`` points over the rows ``m``: the span of their window ends cut into ``points`` buckets
# of equal width (the ``?`` is ``points``), each of which becomes one point.
_SPAN = "span AS (SELECT min(epoch_us(window_end)) AS lo, max(epoch_us(window_end)) AS hi FROM m)"
_BUCKET = "floor((epoch_us(window_end) - lo) * ? / greatest(hi - lo + 1, 1))"


def _of_machine(machine_id: str, since: datetime | None, until: datetime | None) -> _Where:
    """One machine's rows whose window ended from ``since`` to ``until``."""
    where = _Where()
    where.add("machine_id = ?", machine_id)
    return where.within("window_end", since, until)


class MachineQueries(ReaderBase):
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
        where = _of_machine(machine_id, since, until)
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
        where = _of_machine(machine_id, since, until)
        return self.rows(
            f"""
            WITH m AS (SELECT window_end, max_risk, top_kind FROM predictions {where.sql}),
            {_SPAN}
            SELECT max(window_end) AS t, max(max_risk) AS risk, avg(max_risk) AS risk_mean,
                   arg_max(top_kind, max_risk) AS top_kind, count(*) AS windows
            FROM m, span
            GROUP BY {_BUCKET}
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
        where = _Where().within("ts", since, until)
        where.maybe("machine_id = ?", machine_id)
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
        where = _Where().within("failed_at", since, until)
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
        where = _of_machine(machine_id, since, until)
        if sensors:
            where.add("sensor IN (SELECT unnest(?::VARCHAR[]))", list(sensors))
        rows = self.rows(
            f"""
            WITH m AS (SELECT * FROM telemetry_summaries {where.sql}),
            {_SPAN}
            SELECT sensor, max(window_end) AS t, sum(value_mean * samples) / sum(samples) AS mean,
                   min(value_min) AS min, max(value_max) AS max, arg_max(value_last, window_end) AS last,
                   sum(samples) AS samples
            FROM m, span
            GROUP BY sensor, {_BUCKET}
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
        where.within("ts", since, until)
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
