"""What the monitoring pipeline measured, as the drift check reads it from the prediction store.

The monitoring pipeline (:mod:`pipelines.monitoring`) writes ``model_metrics`` (precision, recall and failures per
model version, failure kind and sliding window) and ``drift`` (PSI per feature and window) into the store. The drift
check reads the model version that predicted most recently, in its most recent *full* window: sliding windows that
reach past the newest examples hold only a day or two of them, so of the windows ending within one window length of
the newest, the one with the most examples is read. From it: the any-failure recall, the failures that recall is
measured over, and the largest PSI of that version's outputs or of the fleet's events (the model's input context).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from precursor.contracts.outcomes import ANY_FAILURE
from precursor.store import connect

FLEET = "*"
"""The model version the monitoring pipeline files fleet-wide input drift under."""


class QualityReading(BaseModel):
    """The running model's quality and drift in the newest monitoring window."""

    model_config = ConfigDict(frozen=True)

    model_version: str
    window_start: datetime | None = None
    window_end: datetime | None = None
    recall: float | None = Field(None, ge=0, le=1)
    precision: float | None = Field(None, ge=0, le=1)
    failures: int = Field(0, ge=0, description="failures in the window the recall is measured over")
    drift: float | None = Field(None, ge=0, description="the largest PSI in the window")
    drift_feature: str | None = None


def _has_rows(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchone()
    if not exists or not exists[0]:
        return False
    row = con.execute(f"SELECT count(*) FROM {table}").fetchone()  # table names are ours, never input
    return bool(row and row[0])


def read_quality(store: Path | str) -> QualityReading | None:
    """The newest monitoring figures of the model version that predicted most recently; None before any. ``store``:
    a DuckDB file or a PostgreSQL URL."""
    if isinstance(store, Path) and not store.is_file():
        return None
    try:
        with connect(store, read_only=True) as con:
            return _read_quality(con)
    except FileNotFoundError:  # a PostgreSQL database without the store's tables yet
        return None


def _read_quality(con: duckdb.DuckDBPyConnection) -> QualityReading | None:
    if not _has_rows(con, "model_metrics"):
        return None
    newest = con.execute(
        """
        WITH latest AS (
            SELECT model_version, window_end - window_start AS span FROM model_metrics WHERE kind = ?
            ORDER BY window_end DESC, examples DESC, model_version DESC LIMIT 1
        )
        SELECT m.model_version, m.window_start, m.window_end, m.recall, m.precision, m.failures
        FROM model_metrics AS m JOIN latest USING (model_version)
        WHERE m.kind = ? AND m.window_end > (SELECT max(window_end) FROM model_metrics) - latest.span
        ORDER BY m.examples DESC, m.window_end DESC LIMIT 1
        """,
        [ANY_FAILURE, ANY_FAILURE],
    ).fetchone()
    if newest is None:
        return None
    version, start, end, recall, precision, failures = newest
    drift = None
    if _has_rows(con, "drift"):
        drift = con.execute(
            """
            SELECT psi, feature FROM drift
            WHERE model_version IN (?, ?) AND window_end = ?
            ORDER BY psi DESC LIMIT 1
            """,
            [version, FLEET, end],
        ).fetchone()
    return QualityReading(
        model_version=str(version),
        window_start=start,
        window_end=end,
        recall=recall,
        precision=precision,
        failures=int(failures),
        drift=None if drift is None else float(drift[0]),
        drift_feature=None if drift is None else str(drift[1]),
    )
