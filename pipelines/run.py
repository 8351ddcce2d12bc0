"""``precursor pipeline run``: ingest predictions and events from Kafka into the prediction store.

Runner, chosen on purpose: the local default is Beam's in-process ``FnApiRunner`` (the portable batch runner behind
the DirectRunner). It runs offline, starts in about a second, needs no Docker, no Java and downloads nothing, and each
run is a bounded snapshot of Kafka (see :mod:`pipelines.kafka_io`), so batch semantics are exact. We do not leave it
to ``DirectRunner``'s switching logic, which would first try to download the Prism runner from GitHub. Any other Beam
runner can be named with ``--runner`` (e.g. ``FlinkRunner`` with ``--flink_master``, or ``DataflowRunner``) and the
remaining arguments go to Beam's ``PipelineOptions`` unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from contracts.settings import KafkaSettings
from pipelines.ingest import NAMESPACE, IngestTopic, topic_ingests
from pipelines.kafka_io import PartitionRange, plan_ranges
from store import Offset, PredictionStore

CONSUMER = "ingest-v0"
LOCAL_RUNNER = "local"


@dataclass
class RunReport:
    """What one bounded run did. ``read`` = ``stored`` + ``already_stored`` + ``duplicates`` + ``dead_lettered``."""

    read: int = 0
    stored: int = 0
    already_stored: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    seconds: float = 0.0
    ranges: list[PartitionRange] = field(default_factory=list)

    def __add__(self, other: RunReport) -> RunReport:
        return RunReport(
            self.read + other.read,
            self.stored + other.stored,
            self.already_stored + other.already_stored,
            self.duplicates + other.duplicates,
            self.dead_lettered + other.dead_lettered,
            self.seconds + other.seconds,
            self.ranges + other.ranges,
        )


def _runner(name: str) -> beam.runners.PipelineRunner | str:
    return FnApiRunner() if name == LOCAL_RUNNER else name


def run_once(
    settings: KafkaSettings,
    store_path: str | Path,
    *,
    runner: str = LOCAL_RUNNER,
    beam_args: list[str] | None = None,
    from_beginning: bool = False,
    consumer: str = CONSUMER,
) -> RunReport:
    """Read everything new on the predictions and events topics, store it, then commit progress."""
    started = time.monotonic()
    store = PredictionStore(store_path)
    plans = []
    for ingest in topic_ingests(settings.topics):
        committed = {} if from_beginning else store.offsets(consumer, ingest.topic)
        plans.append((ingest, plan_ranges(settings, ingest.topic, committed)))
    ranges = [r for _, rs in plans for r in rs]
    report = RunReport(read=sum(r.size for r in ranges), ranges=ranges)
    if report.read == 0:
        report.seconds = time.monotonic() - started
        return report

    options = PipelineOptions(beam_args or [])
    pipeline = beam.Pipeline(runner=_runner(runner), options=options)
    for ingest, rs in plans:
        if any(r.size for r in rs):
            _ = pipeline | f"Ingest[{ingest.topic}]" >> IngestTopic(ingest, rs, settings, str(store_path))
    result = pipeline.run()
    result.wait_until_finish()

    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query()["counters"]
        if c.key.metric.namespace == NAMESPACE
    }
    report.stored = sum(v for k, v in counters.items() if k.endswith(".stored"))
    report.already_stored = sum(v for k, v in counters.items() if k.endswith(".already_stored"))
    report.dead_lettered = sum(v for k, v in counters.items() if k.endswith(".dead_lettered"))
    report.duplicates = counters.get("duplicates_dropped", 0)
    # Only now, with every record stored or dead-lettered, does progress move forward.
    store.commit_offsets(consumer, [Offset(r.topic, r.partition, r.end) for r in ranges])
    report.seconds = time.monotonic() - started
    return report


def follow(
    settings: KafkaSettings,
    store_path: str | Path,
    *,
    poll_s: float = 2.0,
    max_runs: int | None = None,
    idle_exit_s: float | None = None,
    on_report: Callable[[RunReport], None] | None = None,
    **kwargs: object,
) -> RunReport:
    """Run bounded snapshots back to back, so the store keeps up with the topics. Stops after ``max_runs``, after
    ``idle_exit_s`` with nothing new, or on Ctrl-C."""
    total = RunReport()
    runs = 0
    idle_since = time.monotonic()
    try:
        while max_runs is None or runs < max_runs:
            report = run_once(settings, store_path, **kwargs)  # type: ignore[arg-type]
            runs += 1
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
