"""``precursor pipeline run``: Kafka predictions, events, heartbeats and telemetry summaries -> the prediction
store, with alerts.

Each run is a bounded snapshot of Kafka (see :mod:`pipelines.kafka_io`): it reads every partition from the committed
offset to the current end, stores and dead-letters what it read, raises and clears alerts
(:mod:`pipelines.alerts`: each prediction is decided in the run that reads it, at its model's operating point), and
only then commits the offsets. Alert state that must outlive a run (each machine's watermark, hysteresis state and
the predictions it has decided lately) is carried in the store, so cutting the stream into more or fewer runs gives
the same alerts. The engine is ``local`` by default; see :mod:`pipelines.engines` for the others.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infra.energy import CostMeter
from pipelines.alerts import RaiseAlerts
from pipelines.edge_trust import HeartbeatJudge
from pipelines.engines import LOCAL, EngineError, EngineSettings, counters, engine
from pipelines.ingest import NAMESPACE, IngestEvents, IngestHeartbeats, IngestPredictions, IngestTelemetrySummaries
from pipelines.kafka_io import PartitionRange, TopicMissing, plan_ranges
from pipelines.run_log import CONSUMER, distributions, ledger_stages, record_run
from pipelines.settings import PipelineSettings
from precursor.contracts.settings import KafkaSettings
from precursor.store import Offset, PredictionStore, ledger

log = logging.getLogger(__name__)


@dataclass
class RunReport:
    """What one bounded run did. ``read`` = ``stored`` + ``already_stored`` + ``duplicates`` + ``dead_lettered``."""

    read: int = 0
    stored: int = 0
    already_stored: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    alerts_raised: int = 0
    alerts_cleared: int = 0
    too_late: int = 0  # predictions behind their machine's watermark on arrival: stored, not alerted on
    heartbeats_read: int = 0  # heartbeats are counted apart from predictions and events
    heartbeats_stored: int = 0
    telemetry_read: int = 0  # telemetry summaries too, apart; each is stored as a row per sensor
    telemetry_rows_stored: int = 0
    telemetry_dead_lettered: int = 0
    seconds: float = 0.0
    ranges: list[PartitionRange] = field(default_factory=list)

    def __add__(self, other: RunReport) -> RunReport:
        return RunReport(
            self.read + other.read,
            self.stored + other.stored,
            self.already_stored + other.already_stored,
            self.duplicates + other.duplicates,
            self.dead_lettered + other.dead_lettered,
            self.alerts_raised + other.alerts_raised,
            self.alerts_cleared + other.alerts_cleared,
            self.too_late + other.too_late,
            self.heartbeats_read + other.heartbeats_read,
            self.heartbeats_stored + other.heartbeats_stored,
            self.telemetry_read + other.telemetry_read,
            self.telemetry_rows_stored + other.telemetry_rows_stored,
            self.telemetry_dead_lettered + other.telemetry_dead_lettered,
            self.seconds + other.seconds,
            self.ranges + other.ranges,
        )


def run_once(
    settings: KafkaSettings,
    store_path: str | Path,
    *,
    pipeline_settings: PipelineSettings | None = None,
    runner: str = LOCAL,
    beam_args: list[str] | None = None,
    engine_settings: EngineSettings | None = None,
    from_beginning: bool = False,
    consumer: str = CONSUMER,
) -> RunReport:
    """Read everything new on the edge topics, store it, raise alerts, then commit progress."""
    started = time.monotonic()
    meter = CostMeter().start()  # CPU and energy of the whole run, for the flow view's cost per prediction
    pipeline_settings = pipeline_settings or PipelineSettings()
    store = PredictionStore(store_path)
    topics = settings.topics
    names = (topics.predictions, topics.events, topics.heartbeats)
    progress = {t: ({}, {}) if from_beginning else _progress(store, consumer, t, settings) for t in names}
    consumed = {t: progress[t][1] for t in names}
    prediction_ranges, event_ranges, heartbeat_ranges = (
        plan_ranges(settings, t, {p: ledger.prefix_end(s, 0) for p, s in consumed[t].items()}) for t in names
    )
    progress[topics.telemetry] = ({}, {}) if from_beginning else _progress(store, consumer, topics.telemetry, settings)
    consumed[topics.telemetry] = progress[topics.telemetry][1]
    telemetry_ranges = _opt_in_ranges(settings, topics.telemetry, consumed[topics.telemetry])
    ranges = prediction_ranges + event_ranges + heartbeat_ranges + telemetry_ranges
    # What a run that did not finish consumed above where these ranges start: skipped, not read again.
    skip = {t: _within(consumed[t], [r for r in ranges if r.topic == t]) for t in consumed}

    def unread(rs: list[PartitionRange]) -> int:
        return sum(r.size - ledger.count(skip[r.topic].get(r.partition, []), r.start, r.end) for r in rs)

    report = RunReport(
        read=unread(prediction_ranges + event_ranges),
        heartbeats_read=unread(heartbeat_ranges),
        telemetry_read=unread(telemetry_ranges),
        ranges=ranges,
    )
    if report.read + report.heartbeats_read + report.telemetry_read == 0:
        # Everything was consumed by a run that did not finish: its ledger is folded in.
        if any(r.start > progress[r.topic][0].get(r.partition, 0) or skip[r.topic] for r in ranges):
            _fold(store, consumer, ranges)
        report.seconds = time.monotonic() - started
        return report

    chosen = engine(runner, beam_args, engine_settings)
    pipeline = chosen.pipeline()
    path = str(store_path)
    regroup = chosen.bundle_per_key
    if any(r.size for r in prediction_ranges):
        predictions = pipeline | "IngestPredictions" >> IngestPredictions(
            prediction_ranges, settings, path, regroup=regroup, consumer=consumer, consumed=skip[topics.predictions]
        )
        _ = predictions | "RaiseAlerts" >> RaiseAlerts(
            pipeline_settings.alert_rule,
            pipeline_settings.allowed_lateness_s * 1_000_000,
            store.alert_timelines(),
            settings,
            path,
            consumer,
        )
    if any(r.size for r in event_ranges):
        _ = pipeline | "IngestEvents" >> IngestEvents(
            event_ranges, settings, path, regroup=regroup, consumer=consumer, consumed=skip[topics.events]
        )
    if any(r.size for r in heartbeat_ranges):
        # Read every run, so an edge the operator just enrolled is verified from the next snapshot on.
        judge = HeartbeatJudge.from_files(pipeline_settings.enrolled_edges, pipeline_settings.model_registry)
        _ = pipeline | "IngestHeartbeats" >> IngestHeartbeats(
            heartbeat_ranges,
            settings,
            path,
            regroup=regroup,
            judge=judge,
            consumer=consumer,
            consumed=skip[topics.heartbeats],
        )
    if any(r.size for r in telemetry_ranges):
        _ = pipeline | "IngestTelemetrySummaries" >> IngestTelemetrySummaries(
            telemetry_ranges, settings, path, regroup=regroup, consumer=consumer, consumed=skip[topics.telemetry]
        )
    with _fewer_young_collections():
        result = pipeline.run()
        result.wait_until_finish()

    c = counters(result, NAMESPACE)
    kinds = ("Prediction", "EdgeEvent")
    report.stored = sum(c.get(f"{k}.stored", 0) for k in kinds)
    report.already_stored = sum(c.get(f"{k}.already_stored", 0) for k in kinds)
    report.dead_lettered = sum(c.get(f"{k}.dead_lettered", 0) for k in kinds)
    report.heartbeats_stored = c.get("heartbeats.stored", 0)
    report.telemetry_rows_stored = c.get("telemetry.stored", 0)
    report.telemetry_dead_lettered = c.get("telemetry.dead_lettered", 0)
    report.duplicates = c.get("duplicates_dropped", 0)
    report.alerts_raised = c.get("alerts.raised", 0)
    report.alerts_cleared = c.get("alerts.cleared", 0)
    report.too_late = c.get("predictions.too_late", 0)
    # Every write recorded its offsets with its rows; now that all of them committed, the ledger is folded into
    # the consumer's offsets (which also covers offsets that hold no record: transaction markers, compaction).
    _fold(store, consumer, ranges)
    record_run(
        settings,
        store_path,
        consumer,
        ranges=ranges,
        counters=c,
        writes=distributions(result, NAMESPACE),
        meter=meter,
        runner=runner,
    )
    report.seconds = time.monotonic() - started
    return report


@contextmanager
def _fewer_young_collections(threshold: int = 100_000) -> Iterator[None]:
    """Python's cycle collector runs less often while the pipeline runs. The local runner holds a snapshot's records
    in this process as many small tuples that form no cycles; at the default threshold (700 allocations) the collector
    kept scanning them, a sixth of ingest's CPU. Reference counting frees them as always; the old threshold is back
    after the run."""
    before = gc.get_threshold()
    gc.set_threshold(max(threshold, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _opt_in_ranges(settings: KafkaSettings, topic: str, consumed: dict[int, ledger.Spans]) -> list[PartitionRange]:
    """The ranges of a topic edges write to only where they opt in (telemetry summaries): a cluster set up without
    it has nothing there to read, which is no error."""
    try:
        return plan_ranges(settings, topic, {p: ledger.prefix_end(s, 0) for p, s in consumed.items()})
    except TopicMissing:
        return []


def _progress(
    store: PredictionStore, consumer: str, topic: str, settings: KafkaSettings
) -> tuple[dict[int, int], dict[int, ledger.Spans]]:
    """The consumer's folded offsets of ``topic``, and the offsets it has finished with (every stage, for
    predictions)."""
    return store.progress(consumer, topic, ledger_stages(consumer, alerted=topic == settings.topics.predictions))


def _within(consumed: dict[int, ledger.Spans], ranges: list[PartitionRange]) -> dict[int, ledger.Spans]:
    """The consumed spans that lie within the ranges a run reads (what its readers skip)."""
    out: dict[int, ledger.Spans] = {}
    for r in ranges:
        spans = ledger.intersect(consumed.get(r.partition, []), [(r.start, r.end)])
        if spans:
            out[r.partition] = spans
    return out


def _fold(store: PredictionStore, consumer: str, ranges: list[PartitionRange]) -> None:
    """A finished run's ranges into the consumer's offsets, its ledger rows below them deleted (all stages)."""
    stages = ledger_stages(consumer, alerted=True)
    store.commit_offsets(consumer, [Offset(r.topic, r.partition, r.end) for r in ranges], stages=stages)


def follow(
    settings: KafkaSettings,
    store_path: str | Path,
    *,
    poll_s: float = 2.0,
    max_runs: int | None = None,
    idle_exit_s: float | None = None,
    on_report: Callable[[RunReport], None] | None = None,
    on_failure: Callable[[Exception, int], None] | None = None,
    max_backoff_s: float = 30.0,
    give_up_on: tuple[type[Exception], ...] = (EngineError,),
    run: Callable[..., RunReport] | None = None,
    **kwargs: object,
) -> RunReport:
    """Run bounded snapshots back to back, so the store keeps up with the topics. Stops after ``max_runs``, after
    ``idle_exit_s`` with nothing new, or on Ctrl-C.

    A run that fails (a broker or a task manager dies under it, the engine's job fails) commits no offsets, so the
    next run reads the same records again from the store's offsets and the store's primary key drops what the failed
    run had already written. The loop goes on after ``poll_s``, doubling up to ``max_backoff_s`` while runs keep
    failing; ``on_failure`` hears each error with the count of failures in a row. Errors of the ``give_up_on`` types
    say the run cannot work as configured (an engine not installed): those end the loop instead. ``run`` is
    :func:`run_once` unless given (a test's stand-in)."""
    run = run or run_once
    total = RunReport()
    runs = failures = 0
    idle_since = time.monotonic()
    try:
        while max_runs is None or runs < max_runs:
            runs += 1
            try:
                report = run(settings, store_path, **kwargs)
            except give_up_on:
                raise
            except Exception as err:  # any failed run is retried from the committed offsets
                failures += 1
                log.warning("pipeline run failed (%d in a row), retrying from the stored offsets: %s", failures, err)
                if on_failure:
                    on_failure(err, failures)
                time.sleep(min(max_backoff_s, poll_s * 2 ** (failures - 1)))
                continue
            failures = 0
            total = total + report
            if report.read:
                idle_since = time.monotonic()
                if on_report:
                    on_report(report)
            elif idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                break
            else:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        pass
    return total
