"""Per-sensor telemetry summaries (mean, min, max per machine and time step): the sensor lines a dashboard draws.

Raw telemetry stays at the edge by default; a site that opts in sends summaries on ``precursor.telemetry``. This
module turns a :class:`~contracts.formats.TelemetryTable` into summary rows and stores them.

>>> import numpy as np
>>> from contracts.formats import TelemetryTable
>>> table = TelemetryTable(machine_ids=np.array(["m-1"] * 4, dtype=object),
...                        timestamps=np.array([0, 60, 3600, 3660]), sensors=["temp"],
...                        values=np.array([[1.0], [3.0], [np.nan], [5.0]], dtype=np.float32))
>>> rows = summarize_telemetry(table, every=timedelta(hours=1)).to_pylist()
>>> [(r["sensor"], r["value_mean"], r["value_min"], r["value_max"], r["samples"]) for r in rows]
[('temp', 2.0, 1.0, 3.0, 2), ('temp', 5.0, 5.0, 5.0, 1)]
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from contracts.formats import TelemetryTable
from store.db import connect

_TS = pa.timestamp("s", tz="UTC")


def summarize_telemetry(table: TelemetryTable, every: timedelta = timedelta(hours=1)) -> pa.Table:
    """One row per machine, sensor and step of length ``every`` (aligned to the epoch) that has readings."""
    step = int(every.total_seconds())
    if step < 1:
        raise ValueError(f"every={every} must be at least one second")
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("machine_id", "sensor", "start", "mean", "min", "max", "n")}
    for machine_id, rows in table.machines():
        buckets = table.timestamps[rows] // step
        edges = np.flatnonzero(np.diff(buckets)) + 1
        starts = np.concatenate([[0], edges])
        for j, sensor in enumerate(table.sensors):
            values = table.values[rows, j].astype(np.float64)
            present = ~np.isnan(values)
            n = np.add.reduceat(present.astype(np.int64), starts)
            filled = np.where(present, values, 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.add.reduceat(filled, starts) / n
            low = np.minimum.reduceat(np.where(present, values, np.inf), starts)
            high = np.maximum.reduceat(np.where(present, values, -np.inf), starts)
            keep = n > 0
            columns["machine_id"].append(np.full(int(keep.sum()), machine_id, dtype=object))
            columns["sensor"].append(np.full(int(keep.sum()), sensor, dtype=object))
            columns["start"].append(buckets[starts][keep] * step)
            columns["mean"].append(mean[keep])
            columns["min"].append(low[keep])
            columns["max"].append(high[keep])
            columns["n"].append(n[keep])

    def joined(name: str, dtype: type | None = None) -> np.ndarray:
        parts = columns[name]
        return np.concatenate(parts) if parts else np.array([], dtype=dtype or np.float64)

    start = joined("start", np.int64).astype(np.int64)
    return pa.table(
        {
            "machine_id": pa.array(joined("machine_id", object), pa.string()),
            "sensor": pa.array(joined("sensor", object), pa.string()),
            "window_start": pa.array(start, _TS),
            "window_end": pa.array(start + step, _TS),
            "value_mean": pa.array(joined("mean"), pa.float64()),
            "value_min": pa.array(joined("min"), pa.float64()),
            "value_max": pa.array(joined("max"), pa.float64()),
            "samples": pa.array(joined("n", np.int64).astype(np.int64), pa.int64()),
        }
    )


def insert_telemetry_summaries(path: str | Path, batch: pa.Table) -> int:
    """Store summary rows, skipping any (machine, sensor, window end) already stored. Returns how many were new."""
    if batch.num_rows == 0:
        return 0
    columns = ", ".join(batch.column_names)
    with connect(path) as con:
        con.register("incoming_summaries", batch)
        inserted = con.execute(
            f"INSERT INTO telemetry_summaries ({columns}) SELECT {columns} FROM incoming_summaries "
            "ON CONFLICT DO NOTHING"
        ).fetchone()
        con.unregister("incoming_summaries")
    return int(inserted[0]) if inserted else 0
