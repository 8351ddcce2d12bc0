"""The models' questions: the versions in use, the rollout across edges (with each edge's identity and trust),
and quality over time.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from precursor.contracts.alerting import DEFAULT_THRESHOLD
from precursor.contracts.outcomes import ANY_FAILURE
from precursor.contracts.versions import version_key
from precursor.store.reader_base import ReaderBase, _horizon, _Where


class ModelQueries(ReaderBase):
    # -- models ------------------------------------------------------------------------------------------------

    def model_versions(
        self, *, edge_id: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Which model versions each edge ran: predictions, machines, and the first and last window of each."""
        where = _Where().within("window_end", since, until)
        where.maybe("edge_id = ?", edge_id)
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
        where = _Where().within("p.window_end", since, until)
        where.maybe("p.model_version = ?", model_version)
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
