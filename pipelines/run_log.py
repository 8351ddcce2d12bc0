"""After each ingest run: keep what it did in the store (:mod:`precursor.store.runs`) and tell Kafka how far it got.

The store's ``consumer_offsets`` stay the truth a run resumes from (committed with the rows they cover). The same
offsets are mirrored to a Kafka consumer group, :func:`ingest_group`, so Kafka's own tools and the flow view see the
pipeline's lag per topic; the mirror is best effort, and a refusal is logged, never fails a run that stored its data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from kafka.errors import KafkaError

from infra.energy import CostMeter
from infra.kafka_admin import commit_group_offsets
from precursor.contracts.settings import KafkaSettings
from precursor.store.runs import PipelineRun, record_pipeline_run

if TYPE_CHECKING:  # Beam is not imported here: the flow view (in the API) reads ingest_group without it
    from apache_beam.runners.runner import PipelineResult

    from pipelines.kafka_io import PartitionRange

log = logging.getLogger("precursor.pipeline")

CONSUMER = "ingest-v0"
"""The ingest's consumer name: its offsets in the store, and (with the topic prefix) its Kafka group."""
WRITE_MS = "store.write_ms"
"""Milliseconds of each store write (one transaction), a Beam distribution: the flow view's store latency."""
ALERTS_STAGE = "alerts"
"""The stage of a consumer that decides alerts on predictions: its own ledger of consumed offsets in the store."""


def ledger_stages(consumer: str, alerted: bool) -> tuple[str, ...]:
    """The ledgers a topic's records must be in to count as consumed (:mod:`precursor.store.ledger`): stored, and
    for predictions (``alerted``) also decided by the alert rule.

    >>> ledger_stages("ingest-v0", True)
    ('ingest-v0', 'ingest-v0/alerts')
    """
    return (consumer, f"{consumer}/{ALERTS_STAGE}") if alerted else (consumer,)


def ingest_group(settings: KafkaSettings, consumer: str) -> str:
    """The Kafka consumer group an ingest consumer's offsets are mirrored to: one per topic prefix.

    >>> ingest_group(KafkaSettings(topic_prefix="plant-7"), "ingest-v0")
    'plant-7.ingest-v0'
    """
    return f"{settings.topic_prefix}.{consumer}"


def distributions(result: PipelineResult, namespace: str) -> dict[str, tuple[int, int, int | None]]:
    """Our distributions of a finished pipeline, by name: (sum, count, max)."""
    out: dict[str, tuple[int, int, int | None]] = {}
    for d in result.metrics().query()["distributions"]:
        if d.key.metric.namespace != namespace:
            continue
        value = d.committed if d.committed is not None else d.attempted
        if value is None or not value.count:
            continue
        total, count, top = out.get(d.key.metric.name, (0, 0, None))
        out[d.key.metric.name] = (total + value.sum, count + value.count, max(top or 0, value.max))
    return out


def _sum(counters: dict[str, int], suffix: str) -> int:
    return sum(v for k, v in counters.items() if k == suffix or k.endswith("." + suffix))


def record_run(
    settings: KafkaSettings,
    store_path: str | Path,
    consumer: str,
    *,
    ranges: Sequence[PartitionRange],
    counters: dict[str, int],
    writes: dict[str, tuple[int, int, int | None]],
    meter: CostMeter,
    runner: str,
) -> PipelineRun:
    """Keep a finished run in the store, and mirror its offsets to the Kafka group; call after the offsets are
    committed. ``meter`` was started with the run and is stopped here."""
    meter.stop()
    finished = datetime.now(UTC)
    total_ms, count, top_ms = writes.get(WRITE_MS, (0, 0, None))
    run = PipelineRun(
        consumer=consumer,
        started_at=finished - timedelta(seconds=meter.wall_s),
        finished_at=finished,
        seconds=meter.wall_s,
        runner=runner,
        read=sum(r.size for r in ranges),
        predictions_read=sum(r.size for r in ranges if r.topic == settings.topics.predictions),
        parsed=_sum(counters, "valid"),
        dead_lettered=_sum(counters, "dead_lettered"),
        duplicates=_sum(counters, "duplicates_dropped"),
        stored_rows=_sum(counters, "stored"),
        already_stored=_sum(counters, "already_stored"),
        store_writes=count,
        store_write_s=total_ms / 1000,
        store_write_max_ms=None if top_ms is None else float(top_ms),
        cpu_s=meter.cpu_s,
        energy_j=meter.energy_j,
        counters=counters,
    )
    record_pipeline_run(store_path, run)
    try:
        commit_group_offsets(
            settings, ingest_group(settings, consumer), {(r.topic, r.partition): r.end for r in ranges}
        )
    except (KafkaError, OSError) as err:
        log.warning("could not mirror offsets to Kafka group %s: %s", ingest_group(settings, consumer), err)
    return run
