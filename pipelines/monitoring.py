"""Monitoring: per model version, precision, recall and lead time over sliding event-time windows, and drift.

Quality comes from the labeled dataset (:mod:`pipelines.labeling`): only final examples, so a window's figures do not
move because a label was still open. Each example is stamped at its window end and falls into the sliding windows
(``monitoring_window`` long, one starting every ``monitoring_every``) that hold that instant. Per model version,
failure kind and window:

- example level: ``tp``, ``fp``, ``fn``, ``tn`` with a window predicted positive when its risk for the kind is at or
  above the decision threshold: the model's own (chosen on its validation data and sent with each prediction), or,
  for predictions without one, the configured threshold (the alert raise threshold unless set apart); ``precision``
  and ``recall``; ``threshold``, the one used.
- failure level: ``failures`` (distinct failures that examples in the window lead up to), ``failures_caught`` (those
  with at least one positive prediction before them) and ``mean_lead_time_h`` (per caught failure, how long before it
  the first positive prediction came).

Kinds: ``failure`` (any failure, scored by the any-failure risk) and each specific kind that appears in a prediction's
risk or in an outcome. A kind the model has never heard of has no risk and is never predicted: when a new failure kind
appears, its recall is 0 and the any-failure recall drops with it, which is what monitoring is for.

Drift (:mod:`pipelines.drift`) is measured over the same windows from the store's predictions and events. A window
whose PSI reaches ``drift_threshold`` is a drift event. Both go to the store (``model_metrics`` and ``drift``, replacing
the rows of an earlier run for the same windows) and come back in a :class:`MonitoringReport`.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows, SlidingWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from pipelines.drift import DriftReference, psi, risk_bin, shares
from pipelines.engines import LOCAL, EngineSettings, engine
from pipelines.labeling import ReadParquetRows as ReadStoreRows
from pipelines.labeling import StoredEvent, StoredPrediction, dataset_glob, day_files, read_day_file
from pipelines.records import MICROS, from_micros, to_micros
from pipelines.settings import PipelineSettings
from pipelines.snapshot import take_snapshot
from precursor.contracts.object_store import as_location
from precursor.contracts.outcomes import ANY_FAILURE, OK
from precursor.store import PredictionStore

FLEET = "*"
UTC_MICROS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class WindowMetrics:
    model_name: str
    model_version: str
    kind: str
    window_start: datetime
    window_end: datetime
    examples: int
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float | None
    recall: float | None
    failures: int
    failures_caught: int
    mean_lead_time_h: float | None
    threshold: float


@dataclass(frozen=True)
class DriftMeasure:
    model_name: str
    model_version: str
    feature: str
    window_start: datetime
    window_end: datetime
    psi: float
    observations: int
    drifted: bool


@dataclass
class MonitoringReport:
    metrics: list[WindowMetrics] = field(default_factory=list)
    drift: list[DriftMeasure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def drift_events(self) -> list[DriftMeasure]:
        return [d for d in self.drift if d.drifted]

    def series(self, kind: str = ANY_FAILURE, model_version: str | None = None) -> list[WindowMetrics]:
        """One kind's windows in time order (of one model version, or of all)."""
        rows = [m for m in self.metrics if m.kind == kind and model_version in (None, m.model_version)]
        return sorted(rows, key=lambda m: (m.window_start, m.model_version))


def judged(example: Mapping[str, Any], threshold: float) -> Iterator[tuple[tuple[str, str, str], tuple[Any, ...]]]:
    """``((model_name, model_version, kind), (actual, predicted, failure id or None, lead hours, threshold))`` per
    kind, judged at the example's own ``threshold`` when it has one, else at ``threshold``.

    >>> e = {"model_name": "lm", "model_version": "1", "machine_id": "m", "outcome": "seal", "failure_at": 50,
    ...      "failure_kinds": ["seal"], "failure_kinds_at": [50], "lead_time_h": 3.0, "window_end": 0,
    ...      "risk": '{"bearing": 0.1, "failure": 0.2}', "risk_any": 0.2}
    >>> sorted((key[2], value[:2]) for key, value in judged(e, threshold=0.5))
    [('bearing', (False, False)), ('failure', (True, False)), ('seal', (True, False))]
    >>> sorted((key[2], value[1], value[4]) for key, value in judged({**e, "threshold": 0.15}, threshold=0.5))
    [('bearing', False, 0.15), ('failure', True, 0.15), ('seal', False, 0.15)]
    """
    own = example.get("threshold")
    if own is not None:
        threshold = float(own)
    risk: dict[str, float] = json.loads(example["risk"])
    model = (example["model_name"], example["model_version"])
    kinds_at = dict(zip(example["failure_kinds"], example["failure_kinds_at"], strict=True))
    window_end = example["window_end"]
    for kind in sorted({ANY_FAILURE, *risk, *kinds_at}):
        if kind == ANY_FAILURE:
            actual = example["outcome"] != OK
            score = example["risk_any"]
            failure_at = example["failure_at"]
        else:
            actual = kind in kinds_at
            score = risk.get(kind, 0.0)
            failure_at = kinds_at.get(kind)
        failure = (example["machine_id"], failure_at) if actual else None
        lead_h = (failure_at - window_end) / (3600 * MICROS) if actual else None
        yield (*model, kind), (actual, score >= threshold, failure, lead_h, threshold)


class ConfusionCounts(beam.CombineFn):
    """Counts of (actual, predicted) and, per failure, the earliest warning (largest lead) a positive gave."""

    def create_accumulator(self) -> list[Any]:
        # tp, fp, fn, tn, failure -> lead of the earliest true positive (None: not caught), the threshold(s) used
        return [0, 0, 0, 0, {}, set()]

    def add_input(self, acc: list[Any], judgement: tuple[Any, ...]) -> list[Any]:
        actual, predicted, failure, lead_h, threshold = judgement
        acc[(0 if predicted else 2) if actual else (1 if predicted else 3)] += 1
        acc[5].add(threshold)
        if actual:
            key = (failure[0], int(failure[1]))
            best = acc[4].get(key)
            if predicted:
                acc[4][key] = lead_h if best is None else max(best, lead_h)
            else:
                acc[4].setdefault(key, None)
        return acc

    def merge_accumulators(self, accumulators: Iterable[list[Any]]) -> list[Any]:
        merged = self.create_accumulator()
        for acc in accumulators:
            for i in range(4):
                merged[i] += acc[i]
            merged[5] |= acc[5]
            for key, lead in acc[4].items():
                best = merged[4].get(key)
                merged[4][key] = lead if best is None else (best if lead is None else max(best, lead))
        return merged

    def extract_output(self, acc: list[Any]) -> list[Any]:
        return acc


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


class DescribeWindow(beam.DoFn):
    """A combined window as a :class:`WindowMetrics` JSON line."""

    def process(
        self, element: tuple[tuple[str, str, str], list[Any]], window: Any = beam.DoFn.WindowParam
    ) -> Iterator[str]:
        (model_name, model_version, kind), (tp, fp, fn, tn, failures, thresholds) = element
        caught = [lead for lead in failures.values() if lead is not None]
        yield json.dumps(
            {
                "model_name": model_name,
                "model_version": model_version,
                "kind": kind,
                "window_start_us": window.start.micros,
                "window_end_us": window.end.micros,
                "examples": tp + fp + fn + tn,
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "tn": tn,
                "precision": _ratio(tp, tp + fp),
                "recall": _ratio(tp, tp + fn),
                "failures": len(failures),
                "failures_caught": len(caught),
                "mean_lead_time_h": sum(caught) / len(caught) if caught else None,
                # One per model version in practice; should edges disagree, the strictest is the one reported.
                "threshold": max(thresholds),
            },
            sort_keys=True,
        )


class MeasureQuality(beam.PTransform):
    """Labeled examples (dicts, stamped at their window end) -> WindowMetrics JSON lines."""

    def __init__(self, settings: PipelineSettings) -> None:
        super().__init__()
        self._settings = settings

    def expand(self, examples: beam.PCollection) -> beam.PCollection:
        threshold = self._settings.threshold
        return (
            examples
            | "SlidingWindows" >> beam.WindowInto(_sliding(self._settings))
            | "Judge" >> beam.FlatMap(lambda e: judged(e, threshold))
            | "CountOutcomes" >> beam.CombinePerKey(ConfusionCounts())
            | "DescribeWindows" >> beam.ParDo(DescribeWindow())
        )


def _sliding(settings: PipelineSettings) -> SlidingWindows:
    return SlidingWindows(
        size=settings.monitoring_window.total_seconds(), period=settings.monitoring_every.total_seconds()
    )


def prediction_features(row: tuple[Any, ...]) -> Iterator[tuple[tuple[str, str, str], str]]:
    """``((model_name, model_version, feature), value)`` of one stored prediction."""
    p = StoredPrediction(*row)
    risk: dict[str, float] = json.loads(p.risk)
    top_kind, top = max(sorted(risk.items()), key=lambda pair: pair[1])
    yield (p.model_name, p.model_version, "max_risk"), risk_bin(top)
    yield (p.model_name, p.model_version, "top_kind"), top_kind


def event_features(row: tuple[Any, ...]) -> Iterator[tuple[tuple[str, str, str], str]]:
    yield (FLEET, FLEET, "events"), StoredEvent(*row).event


class CountValues(beam.CombineFn):
    def create_accumulator(self) -> dict[str, int]:
        return {}

    def add_input(self, acc: dict[str, int], value: str) -> dict[str, int]:
        acc[value] = acc.get(value, 0) + 1
        return acc

    def merge_accumulators(self, accumulators: Iterable[dict[str, int]]) -> dict[str, int]:
        merged: dict[str, int] = {}
        for acc in accumulators:
            for value, n in acc.items():
                merged[value] = merged.get(value, 0) + n
        return merged

    def extract_output(self, acc: dict[str, int]) -> dict[str, int]:
        return acc


class CompareToReference(beam.DoFn):
    """All windows of one (model, feature) -> a DriftMeasure JSON line per window, against the reference histogram:
    the given one, else that of the first window with enough observations. A window with too few decides nothing."""

    def __init__(self, reference: DriftReference, threshold: float, min_observations: int) -> None:
        self._reference = reference
        self._threshold = threshold
        self._min_observations = min_observations

    def process(self, element: tuple[tuple[str, str, str], Iterable[tuple[int, int, dict[str, int]]]]) -> Iterator[str]:
        (model_name, model_version, feature), windows = element
        ordered = sorted(windows, key=lambda w: w[0])
        enough = [counts for _, _, counts in ordered if sum(counts.values()) >= self._min_observations]
        reference = self._reference.features.get(feature) or (shares(enough[0]) if enough else {})
        for start_us, end_us, counts in ordered:
            value = psi(reference, counts)
            observations = sum(counts.values())
            yield json.dumps(
                {
                    "model_name": model_name,
                    "model_version": model_version,
                    "feature": feature,
                    "window_start_us": start_us,
                    "window_end_us": end_us,
                    "psi": value,
                    "observations": observations,
                    "drifted": value >= self._threshold and observations >= self._min_observations,
                },
                sort_keys=True,
            )


class MeasureDrift(beam.PTransform):
    """Feature values ``((model, version, feature), value)`` stamped in event time -> DriftMeasure JSON lines."""

    def __init__(self, settings: PipelineSettings, reference: DriftReference) -> None:
        super().__init__()
        self._settings = settings
        self._reference = reference

    def expand(self, features: beam.PCollection) -> beam.PCollection:
        s = self._settings
        return (
            features
            | "SlidingWindows" >> beam.WindowInto(_sliding(self._settings))
            | "CountValues" >> beam.CombinePerKey(CountValues())
            | "TagWindow"
            >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv[0], (w.start.micros, w.end.micros, kv[1])))
            | "AllWindows" >> beam.WindowInto(GlobalWindows())
            | "GroupWindows" >> beam.GroupByKey()
            | "CompareToReference"
            >> beam.ParDo(CompareToReference(self._reference, s.drift_threshold, s.drift_min_observations))
        )


def _example_dicts(table: pa.Table) -> Iterator[TimestampedValue]:
    for row in table.to_pylist():
        for name in ("window_end", "failure_at"):
            row[name] = None if row[name] is None else to_micros(row[name])
        row["failure_kinds_at"] = [to_micros(t) for t in row["failure_kinds_at"]]
        row["window_start"] = to_micros(row["window_start"])
        yield TimestampedValue(row, Timestamp(micros=row["window_end"]))


def _metrics_table(rows: list[WindowMetrics]) -> pa.Table:
    data = [asdict(m) for m in rows]
    now = datetime.now(UTC)
    for row in data:
        row["computed_at"] = now
    return pa.Table.from_pylist(data) if data else pa.table({})


def run_monitoring(
    store_path: str | Path,
    dataset: str | Path,
    *,
    settings: PipelineSettings | None = None,
    reference: DriftReference | None = None,
    runner: str = LOCAL,
    beam_args: list[str] | None = None,
    engine_settings: EngineSettings | None = None,
) -> MonitoringReport:
    """Quality per model version and kind from the labeled ``dataset``, drift from the store; both into the store."""
    started = time.monotonic()
    settings = settings or PipelineSettings()
    reference = reference or DriftReference()
    dataset = as_location(dataset)
    # A local dataset is one file pattern for Beam's reader; one on an object store is read file by file through
    # fsspec, each worker with the object store settings of its own environment.
    local_files = dataset_glob(dataset) if isinstance(dataset, Path) else None
    remote_files = [] if isinstance(dataset, Path) else day_files(dataset)
    with tempfile.TemporaryDirectory(prefix="monitoring-", dir=settings.work_dir) as work:
        snapshot = take_snapshot(store_path, work)
        out = Path(work)
        pipeline = engine(runner, beam_args, engine_settings).pipeline()
        tables = None
        if local_files is not None:
            tables = pipeline | "ReadExamples" >> beam.io.ReadFromParquetBatched(local_files)
        elif remote_files:
            tables = pipeline | "ListDays" >> beam.Create(remote_files) | "ReadExamples" >> beam.Map(read_day_file)
        if tables is not None:
            _ = (
                tables
                | "ToExamples" >> beam.FlatMap(_example_dicts)
                | "MeasureQuality" >> MeasureQuality(settings)
                | "WriteMetrics" >> beam.io.WriteToText(str(out / "metrics"), shard_name_template="")
            )
        predictions = pipeline | "ReadPredictions" >> ReadStoreRows(
            str(snapshot.predictions), StoredPrediction._fields.index("window_end_us")
        )
        events = pipeline | "ReadEvents" >> ReadStoreRows(str(snapshot.events), StoredEvent._fields.index("at_us"))
        _ = (
            (
                predictions | "PredictionFeatures" >> beam.FlatMap(prediction_features),
                events | "EventFeatures" >> beam.FlatMap(event_features),
            )
            | "AllFeatures" >> beam.Flatten()
            | "MeasureDrift" >> MeasureDrift(settings, reference)
            | "WriteDrift" >> beam.io.WriteToText(str(out / "drift"), shard_name_template="")
        )
        pipeline.run().wait_until_finish()
        metrics = [_window_metrics(json.loads(line)) for line in _lines(out / "metrics")]
        drift = [_drift_measure(json.loads(line)) for line in _lines(out / "drift")]
    report = MonitoringReport(
        metrics=sorted(metrics, key=lambda m: (m.model_name, m.model_version, m.kind, m.window_start)),
        drift=sorted(drift, key=lambda d: (d.model_name, d.model_version, d.feature, d.window_start)),
    )
    store = PredictionStore(store_path)
    store.insert_table("model_metrics", _metrics_table(report.metrics), replace=True)
    store.insert_table("drift", _drift_table(report.drift), replace=True)
    report.seconds = time.monotonic() - started
    return report


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _window_metrics(row: dict[str, Any]) -> WindowMetrics:
    row["window_start"] = from_micros(row.pop("window_start_us"))
    row["window_end"] = from_micros(row.pop("window_end_us"))
    return WindowMetrics(**row)


def _drift_measure(row: dict[str, Any]) -> DriftMeasure:
    row["window_start"] = from_micros(row.pop("window_start_us"))
    row["window_end"] = from_micros(row.pop("window_end_us"))
    return DriftMeasure(**row)


def _drift_table(rows: list[DriftMeasure]) -> pa.Table:
    data = [asdict(d) for d in rows]
    now = datetime.now(UTC)
    for row in data:
        row["computed_at"] = now
    return pa.Table.from_pylist(data) if data else pa.table({})
