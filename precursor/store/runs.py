"""What each ingest run did, kept beside the data it wrote: records read and handled per stage, how long the store
writes took, and the CPU and energy the run used. The flow view reads throughput and cost from here.

A run that found nothing new leaves no row; rows older than :data:`KEEP` are deleted as new ones come.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from precursor.store import ledger
from precursor.store.db import connect
from precursor.store.queries import StoreReader

KEEP = timedelta(days=7)

PIPELINE_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS pipeline_runs (
    consumer           VARCHAR     NOT NULL,
    started_at         TIMESTAMPTZ NOT NULL,
    finished_at        TIMESTAMPTZ NOT NULL,
    seconds            DOUBLE      NOT NULL,
    runner             VARCHAR     NOT NULL,
    read               BIGINT      NOT NULL,
    predictions_read   BIGINT      NOT NULL,
    parsed             BIGINT      NOT NULL,
    dead_lettered      BIGINT      NOT NULL,
    duplicates         BIGINT      NOT NULL,
    stored_rows        BIGINT      NOT NULL,
    already_stored     BIGINT      NOT NULL,
    store_writes       BIGINT      NOT NULL,
    store_write_s      DOUBLE      NOT NULL,
    store_write_max_ms DOUBLE,
    cpu_s              DOUBLE      NOT NULL,
    energy_j           DOUBLE,
    counters           JSON        NOT NULL,
    PRIMARY KEY (consumer, started_at)
);
"""


@dataclass(frozen=True)
class PipelineRun:
    """One bounded ingest run. ``read``: records taken from Kafka, all topics; ``parsed``: those that matched their
    contract; ``stored_rows`` and ``already_stored``: store rows written new or found already there (a telemetry
    summary is a row per sensor); ``energy_j``: RAPL, where readable (None: estimate it from ``cpu_s``)."""

    consumer: str
    started_at: datetime
    finished_at: datetime
    seconds: float
    runner: str
    read: int
    predictions_read: int
    parsed: int
    dead_lettered: int
    duplicates: int
    stored_rows: int
    already_stored: int
    store_writes: int
    store_write_s: float
    store_write_max_ms: float | None
    cpu_s: float
    energy_j: float | None
    counters: dict[str, int] = field(default_factory=dict)


_RUN_COLUMNS = ", ".join(f.name for f in fields(PipelineRun) if f.name != "counters")


def record_pipeline_run(path: str | Path, run: PipelineRun) -> None:
    """Keep ``run`` (and forget runs older than :data:`KEEP`)."""
    row = asdict(run)
    row["counters"] = json.dumps(run.counters, sort_keys=True)
    columns = ", ".join(row)
    with connect(path) as con:
        con.execute(PIPELINE_RUNS_TABLE)
        con.execute(
            f"INSERT INTO pipeline_runs ({columns}) VALUES ({', '.join('?' * len(row))}) ON CONFLICT DO NOTHING",
            list(row.values()),
        )
        con.execute("DELETE FROM pipeline_runs WHERE finished_at < ?", [run.finished_at - KEEP])


def runs_since(store: StoreReader, since: datetime, consumer: str) -> list[dict[str, Any]]:
    """The runs of ``consumer`` that finished at or after ``since``, oldest first; none in a store without the
    table."""
    if not store.has_table("pipeline_runs"):
        return []
    return store.rows(
        f"SELECT {_RUN_COLUMNS}, counters::VARCHAR AS counters FROM pipeline_runs "
        "WHERE consumer = ? AND finished_at >= ? ORDER BY finished_at",
        [consumer, since],
    )


def last_run(store: StoreReader, consumer: str) -> dict[str, Any] | None:
    """The newest run of ``consumer``, or None."""
    if not store.has_table("pipeline_runs"):
        return None
    rows = store.rows(
        f"SELECT {_RUN_COLUMNS}, counters::VARCHAR AS counters FROM pipeline_runs WHERE consumer = ? "
        "ORDER BY finished_at DESC LIMIT 1",
        [consumer],
    )
    return rows[0] if rows else None


def table_rows(store: StoreReader, tables: tuple[str, ...]) -> dict[str, int]:
    """Rows per table, for the tables the store has."""
    return {t: int(store.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables if store.has_table(t)}


def latest_edge_flows(store: StoreReader, since: datetime) -> list[dict[str, Any]]:
    """Each edge's newest heartbeat since ``since`` that carries a flow, forged ones left out."""
    if not store.has_table("heartbeats"):
        return []
    has_flow = store.con.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_catalog = current_database() "
        "AND table_schema = current_schema() AND table_name = 'heartbeats' AND column_name = 'flow'"
    ).fetchone()
    if not has_flow:
        return []
    return store.rows(
        """
        SELECT edge_id, ts, outbox_depth, lag_s, health, machines, flow::VARCHAR AS flow
        FROM heartbeats WHERE trust <> 'forged' AND flow IS NOT NULL AND ts >= ?
        QUALIFY row_number() OVER (PARTITION BY edge_id ORDER BY ts DESC, seq DESC) = 1
        ORDER BY edge_id
        """,
        [since],
    )


def consumer_positions(
    store: StoreReader, consumer: str, stages: Mapping[str, Sequence[str]] | None = None
) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> next offset`` the consumer has reached in the store: what its finished runs folded
    into ``consumer_offsets``, extended by the ledger of a run that did not finish (``stages``: topic -> the ledgers
    its records must be in, as :func:`pipelines.run_log.ledger_stages` names them), as the next run will start there.
    Without the ledger, a run killed after storing most of its records read as if none of them were: the lag shown
    was the whole run's until the next run folded it."""
    if not store.has_table("consumer_offsets"):
        return {}
    rows = store.con.execute(
        "SELECT topic, partition, next_offset FROM consumer_offsets WHERE consumer = ?", [consumer]
    ).fetchall()
    folded: dict[str, dict[int, int]] = {}
    for t, p, o in rows:
        folded.setdefault(str(t), {})[int(p)] = int(o)
    reached = {(t, p): o for t, offsets in folded.items() for p, o in offsets.items()}
    if not stages or not store.has_table("consumed_ranges"):
        return reached
    for topic, names in stages.items():
        ledgers = [
            store.con.execute(
                "SELECT partition, spans FROM consumed_ranges WHERE consumer = ? AND topic = ?", [name, topic]
            ).fetchall()
            for name in names
        ]
        if not any(ledgers):
            continue
        next_offsets = folded.get(topic, {})
        for partition, spans in ledger.consumed(next_offsets, ledgers).items():
            start = next_offsets.get(partition, 0)
            reached[(topic, partition)] = max(start, ledger.prefix_end(spans, start))
    return reached
