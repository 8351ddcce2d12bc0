"""A consistent snapshot of the store's predictions and events as Parquet files: the input of labeling and monitoring.

The store is a single-writer DuckDB file; pipeline workers (on Prism, Flink or anywhere else) should not hold it.
So the driver copies what a pipeline needs into Parquet once, in one read transaction, and the pipeline reads the
files: locally from a temporary folder, at scale from shared or object storage. Times are epoch microseconds, the unit
of Beam timestamps and of :mod:`pipelines.records`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from precursor.store import connect
from precursor.store.location import is_postgres

PREDICTION_QUERY = """
SELECT edge_id, seq, machine_id, epoch_us(window_start) AS window_start_us, epoch_us(window_end) AS window_end_us,
       horizon_h, risk::VARCHAR AS risk, model_name, model_version, threshold
FROM predictions
ORDER BY machine_id, window_end, edge_id, seq
"""
EVENT_QUERY = """
SELECT edge_id, seq, machine_id, epoch_us(ts) AS at_us, event
FROM events
ORDER BY machine_id, ts, edge_id, seq
"""


@dataclass(frozen=True)
class Snapshot:
    predictions: Path
    events: Path
    prediction_count: int
    event_count: int


def take_snapshot(store_path: str | Path, folder: str | Path) -> Snapshot:
    """Copy predictions and events into ``folder/predictions.parquet`` and ``folder/events.parquet``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    predictions, events = folder / "predictions.parquet", folder / "events.parquet"
    if is_postgres(store_path):
        from precursor.store.postgres import read_consistent  # psycopg and sqlglot: only for a PostgreSQL store

        with connect(store_path, read_only=True) as pg:
            rows = read_consistent(pg, [PREDICTION_QUERY, EVENT_QUERY])  # type: ignore[arg-type]
        for table, path in zip(rows, (predictions, events), strict=True):
            pq.write_table(table, path)
        return Snapshot(predictions, events, rows[0].num_rows, rows[1].num_rows)
    with connect(store_path, read_only=True) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute(f"COPY ({PREDICTION_QUERY}) TO '{predictions}' (FORMAT PARQUET)")
        con.execute(f"COPY ({EVENT_QUERY}) TO '{events}' (FORMAT PARQUET)")
        counts = con.execute(
            f"SELECT (SELECT count(*) FROM '{predictions}'), (SELECT count(*) FROM '{events}')"
        ).fetchone()
        con.execute("COMMIT")
    assert counts is not None
    return Snapshot(predictions, events, int(counts[0]), int(counts[1]))
