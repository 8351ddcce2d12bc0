"""The fleet's questions: what is at risk now and since when, what the fleet page counts, each machine's
operating point, and predictions per edge.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from precursor.contracts.alerting import AlertRule
from precursor.store.reader_base import ELEVATED_LOOKBACK, Page, ReaderBase, _operating_point, _Where


class FleetQueries(ReaderBase):
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
