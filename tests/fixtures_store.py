"""Messages into a prediction store exactly as ingest writes them, for tests that need a filled store without Kafka.

Each message goes through its own ingest composite's record and batch layout (:mod:`pipelines.ingest`) and the store's
insert (which also keeps ``latest_predictions``), so a test's store has the pipeline's rows: there is one row layout,
and it is the one the pipeline writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pipelines.edge_trust import HeartbeatJudge
from pipelines.ingest import IngestEvents, IngestHeartbeats, IngestPredictions, IngestTelemetrySummaries
from precursor.contracts.messages import EdgeMessage
from precursor.contracts.settings import KafkaSettings
from precursor.store import PredictionStore
from precursor.store.queries import reading

INGESTS = (IngestPredictions, IngestEvents, IngestHeartbeats, IngestTelemetrySummaries)


def store_messages(
    path: Path | str, messages: Iterable[EdgeMessage], *, judge: HeartbeatJudge | None = None, first_offset: int = 0
) -> int:
    """Write predictions, events, heartbeats and telemetry summaries (in any mix) as ingest would; returns the rows
    that were new. Heartbeats are judged by ``judge`` (none: an unsigned one reads as unsigned); the records'
    offsets count from ``first_offset`` in the order given."""
    by_model: dict[type, list[EdgeMessage]] = {}
    for message in messages:
        ingest = next((i for i in INGESTS if isinstance(message, i.model)), None)
        if ingest is None:
            raise TypeError(f"ingest stores no {type(message).__name__}")
        by_model.setdefault(ingest.model, []).append(message)
    store = PredictionStore(path)
    written = 0
    for ingest_type in INGESTS:
        chosen: Sequence[EdgeMessage] = by_model.get(ingest_type.model, [])
        if not chosen:
            continue
        ingest = (
            IngestHeartbeats([], KafkaSettings(), str(path), judge=judge)
            if ingest_type is IngestHeartbeats
            else ingest_type([], KafkaSettings(), str(path))
        )
        rows = [
            tuple(ingest.to_record(m, partition=0, offset=first_offset + i))  # type: ignore[misc]
            for i, m in enumerate(chosen)
        ]
        written += store.insert_table(ingest.table, ingest.to_batch(rows, datetime.now(UTC)))
    return written


def store_digest(location: Path | str) -> str:
    """What a write would change: a DuckDB file's bytes; a PostgreSQL store's tables and their row counts."""
    if isinstance(location, Path):
        return hashlib.sha256(location.read_bytes()).hexdigest()
    with reading(location) as store:
        tables = sorted(r["t"] for r in store.rows("SELECT table_name AS t FROM information_schema.tables"))
        counts = {t: store.rows(f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in tables if store.has_table(t)}
    return f"{tables}{counts}"
