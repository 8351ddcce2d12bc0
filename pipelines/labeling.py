"""Labeling: each prediction joined with the failures reported after it into a training dataset, in event time.

The rule is the training rule of :mod:`models.training.dataset`, so the labels the field produces and the labels
training computes from files agree exactly: the **outcome** of a prediction for machine ``m`` whose window ends at ``t``
with horizon ``H`` is the kind of ``m``'s first failure in ``[t, t + H)`` (``failure`` when the event names no kind),
else ``ok``. A failure at ``t`` itself counts: the window covered ``[t - window, t)`` and did not see it.

Event time and completeness. Failures arrive late: an edge may be offline for a day and then deliver its backlog. An
edge delivers its own records in order (its outbox is a queue), so once the store holds a record of edge ``e`` with
event time ``T``, every record of ``e`` before ``T - allowed_lateness`` is in. That is ``e``'s **watermark**. A
prediction is **final** when its outcome was decided before the watermark of the edge that sent it: its first
failure in the horizon, or else the end of its horizon, lies at or before the watermark. Until then it is
**pending**: not written, counted in the report, labeled by a later run.

The dataset (what a retraining loop needs):

- Parquet, one file per day of window end: ``<dataset>/day=YYYY-MM-DD/part-0.parquet`` (Hive partitioning, so
  DuckDB, pyarrow and Spark read the folder as one table with a ``day`` column), rows sorted by machine and time.
  ``<dataset>`` is a local folder or an object store URL (``s3://bucket/labeled``, see
  :mod:`precursor.contracts.object_store`);
  workers that write days open it with the object store settings of their own environment, so no credential travels
  inside the pipeline.
- One row per final prediction: ``machine_id``, ``window_start``, ``window_end``, ``horizon_h`` (the window is the
  pointer to its telemetry), ``outcome`` (``ok`` or the failure kind, as in ``models.training.dataset.LabeledWindow``),
  ``failure_kinds`` (every kind that failed within the horizon) with ``failure_kinds_at`` (the first failure of each),
  ``failure_at`` and ``lead_time_h`` (from the window end to the first failure), and what the deployed model said:
  ``model_name``, ``model_version``, ``risk`` (JSON of risk per kind), ``risk_any`` (the any-failure risk), plus
  ``edge_id`` and ``seq`` (the prediction's identity).
- ``<dataset>/_dataset.json`` names the format and the label rule.

Retraining joins the rows on ``(machine_id, window_end)`` with windows cut from telemetry by
``models.training.dataset.build_windows`` (the same boundaries as the edge's), which gives the model's exact input: raw
telemetry stays at the edge by default and reaches training as generic-format files. The labels from the field are the
ones to trust where they differ from a file's events, and ``risk`` per model version shows where the deployed model was
wrong (hard examples, and the champion's score on the same windows for a challenger to beat).

Idempotent: the dataset is a function of the store. Every run rebuilds the days it covers and rewrites a day's file
only when its rows changed (written to a temporary file, then renamed; on an object store, one PUT), so re-running
changes nothing, and cutting ingestion into more runs gives the same files.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from pipelines.engines import LOCAL, EngineSettings, counters, engine
from pipelines.records import HOUR_US, MICROS
from pipelines.settings import PipelineSettings
from pipelines.snapshot import take_snapshot
from precursor.contracts.object_store import (
    ObjectStoreSettings,
    as_location,
    describe,
    explained,
    filesystem,
    is_local,
    join,
)
from precursor.contracts.outcomes import ANY_FAILURE, OK, failure_kind
from precursor.contracts.parquet import read_parquet_bytes

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

NAMESPACE = "precursor.labeling"
DATASET_FORMAT = "precursor-labeled-windows/1"
LABEL_RULE = "outcome = kind of the first failure in [window_end, window_end + horizon), else ok"
DAY_US = 86_400 * MICROS
UTC_MICROS = pa.timestamp("us", tz="UTC")

SCHEMA = pa.schema(
    [
        pa.field("machine_id", pa.string(), nullable=False),
        pa.field("window_start", UTC_MICROS, nullable=False),
        pa.field("window_end", UTC_MICROS, nullable=False),
        pa.field("horizon_h", pa.float64(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("failure_kinds", pa.list_(pa.string()), nullable=False),
        pa.field("failure_kinds_at", pa.list_(UTC_MICROS), nullable=False),
        pa.field("failure_at", UTC_MICROS),
        pa.field("lead_time_h", pa.float64()),
        pa.field("model_name", pa.string(), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),
        pa.field("risk", pa.string(), nullable=False),
        pa.field("risk_any", pa.float64(), nullable=False),
        pa.field("edge_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("threshold", pa.float64()),
    ]
)


class StoredPrediction(NamedTuple):
    edge_id: str
    seq: int
    machine_id: str
    window_start_us: int
    window_end_us: int
    horizon_h: float
    risk: str  # JSON, as stored
    model_name: str
    model_version: str
    threshold: float | None = None  # the model's own alert threshold, when its predictions carried one


class StoredEvent(NamedTuple):
    edge_id: str
    seq: int
    machine_id: str
    at_us: int
    event: str


class Example(NamedTuple):
    """One labeled prediction: a row of the dataset, times in epoch microseconds."""

    machine_id: str
    window_start_us: int
    window_end_us: int
    horizon_h: float
    outcome: str
    failure_kinds: tuple[str, ...]
    failure_kinds_at_us: tuple[int, ...]  # the first failure of each kind, aligned with failure_kinds
    failure_at_us: int | None
    lead_time_h: float | None
    model_name: str
    model_version: str
    risk: str
    risk_any: float
    edge_id: str
    seq: int
    threshold: float | None


def label(prediction: StoredPrediction, failures: list[tuple[int, str]], watermark_us: int | None) -> Example | None:
    """The example of one prediction, or ``None`` while its outcome is still open at the watermark.

    ``failures`` are the machine's (time, kind) failures, sorted by time.

    >>> p = StoredPrediction("e", 1, "m", 0, 10 * HOUR_US, 24.0, '{"failure": 0.9}', "lm", "1")
    >>> label(p, [(20 * HOUR_US, "bearing")], watermark_us=21 * HOUR_US).outcome
    'bearing'
    >>> label(p, [], watermark_us=33 * HOUR_US) is None  # the horizon ends at 34 h: still open
    True
    >>> label(p, [], watermark_us=34 * HOUR_US).outcome
    'ok'
    """
    start = prediction.window_end_us
    end = start + round(prediction.horizon_h * HOUR_US)
    within = [(at, kind) for at, kind in failures if start <= at < end]
    decided_at = within[0][0] if within else end
    if watermark_us is None or decided_at > watermark_us:
        return None
    risk = json.loads(prediction.risk)
    first_at = within[0][0] if within else None
    first_of_kind: dict[str, int] = {}
    for at, kind in within:
        first_of_kind.setdefault(kind, at)
    kinds = sorted(first_of_kind)
    return Example(
        machine_id=prediction.machine_id,
        window_start_us=prediction.window_start_us,
        window_end_us=start,
        horizon_h=prediction.horizon_h,
        outcome=within[0][1] if within else OK,
        failure_kinds=tuple(kinds),
        failure_kinds_at_us=tuple(first_of_kind[k] for k in kinds),
        failure_at_us=first_at,
        lead_time_h=None if first_at is None else (first_at - start) / HOUR_US,
        model_name=prediction.model_name,
        model_version=prediction.model_version,
        risk=json.dumps(risk, sort_keys=True),
        risk_any=float(risk.get(ANY_FAILURE, max(risk.values(), default=0.0))),
        edge_id=prediction.edge_id,
        seq=prediction.seq,
        threshold=prediction.threshold,
    )


def _rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    yield from zip(*(column.to_pylist() for column in table.columns), strict=True)


class LabelMachine(beam.DoFn):
    """``(machine_id, {predictions, failures})`` -> the machine's final examples; pending ones are counted."""

    def __init__(self) -> None:
        self._final = Metrics.counter(NAMESPACE, "examples.final")
        self._pending = Metrics.counter(NAMESPACE, "examples.pending")

    def process(
        self, element: tuple[str, Mapping[str, Iterable[Any]]], watermarks: Mapping[str, int]
    ) -> Iterator[TimestampedValue]:
        _, joined = element
        failures = sorted(tuple(f) for f in joined["failures"])
        for row in joined["predictions"]:
            prediction = StoredPrediction(*row)
            example = label(prediction, failures, watermarks.get(prediction.edge_id))
            if example is None:
                self._pending.inc()
                continue
            self._final.inc()
            yield TimestampedValue(tuple(example), Timestamp(micros=example.window_end_us))


def day_of(micros: int) -> str:
    """``2026-03-01``: the UTC day an instant falls on, the dataset's partition."""
    return datetime.fromtimestamp(micros // MICROS, UTC).strftime("%Y-%m-%d")


def examples_table(examples: Iterable[Example]) -> pa.Table:
    rows = sorted(
        examples, key=lambda e: (e.machine_id, e.window_end_us, e.model_name, e.model_version, e.edge_id, e.seq)
    )
    columns: dict[str, list[Any]] = {name: [] for name in Example._fields}
    for e in rows:
        for name, value in zip(Example._fields, e, strict=True):
            columns[name].append(value)
    return pa.table(
        {
            "machine_id": columns["machine_id"],
            "window_start": pa.array(columns["window_start_us"], UTC_MICROS),
            "window_end": pa.array(columns["window_end_us"], UTC_MICROS),
            "horizon_h": columns["horizon_h"],
            "outcome": columns["outcome"],
            "failure_kinds": [list(k) for k in columns["failure_kinds"]],
            "failure_kinds_at": pa.array([list(a) for a in columns["failure_kinds_at_us"]], pa.list_(UTC_MICROS)),
            "failure_at": pa.array(columns["failure_at_us"], UTC_MICROS),
            "lead_time_h": pa.array(columns["lead_time_h"], pa.float64()),
            "model_name": columns["model_name"],
            "model_version": columns["model_version"],
            "risk": columns["risk"],
            "risk_any": columns["risk_any"],
            "edge_id": columns["edge_id"],
            "seq": pa.array(columns["seq"], pa.int64()),
            "threshold": pa.array(columns["threshold"], pa.float64()),
        },
        schema=SCHEMA,
    )


DAY_FILES = "day=*/part-0.parquet"
_DAY_FILE = re.compile(r"day=[^/]+/part-0\.parquet")


def day_file(dataset: Path | str, day: str) -> Path | str:
    """Where a day's examples are: a ``Path`` in a local dataset, a URL in one on an object store."""
    return join(dataset, f"day={day}", "part-0.parquet")


def write_day(table: pa.Table, dataset: Path | str, day: str, settings: ObjectStoreSettings | None = None) -> bool:
    """Write a day's examples unless the file holds exactly these rows already; whether it was written.

    Readers see the old file or the new one, never half of one: a local file is written aside and renamed, an object
    is one PUT.
    """
    with explained(dataset, settings):
        fs, target = filesystem(day_file(dataset, day), settings)
        existing = _read_bytes(fs, target)
        if existing is not None and read_parquet_bytes(existing, SCHEMA).equals(table):
            return False
        if is_local(fs):
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=Path(target).parent, prefix=".part-0.", suffix=".tmp")
            os.close(fd)
            pq.write_table(table, temporary)
            os.replace(temporary, target)
        else:
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            fs.pipe_file(target, sink.getvalue().to_pybytes())
        return True


class WriteDay(beam.DoFn):
    """``(day, examples)`` -> the day's Parquet file, rewritten only when its rows changed. Emits ``(day, rows,
    changed)``. The dataset is a path or URL; object store settings come from the worker's environment."""

    def __init__(self, dataset: str) -> None:
        self._dataset = dataset

    def process(self, element: tuple[str, Iterable[tuple[Any, ...]]]) -> Iterator[tuple[str, int, bool]]:
        day, rows = element
        table = examples_table(Example(*r) for r in rows)
        changed = write_day(table, as_location(self._dataset), day)
        yield day, table.num_rows, changed


class LabelPredictions(beam.PTransform):
    """``{predictions, events}`` (store rows) -> final examples stamped at their window end."""

    def __init__(self, allowed_lateness_us: int) -> None:
        super().__init__()
        self._lateness_us = allowed_lateness_us

    def expand(self, inputs: Mapping[str, beam.PCollection]) -> beam.PCollection:
        predictions, events = inputs["predictions"], inputs["events"]
        lateness = self._lateness_us
        newest = (
            (
                predictions | "PredictionTimes" >> beam.Map(lambda r: (r[0], r[4])),
                events | "EventTimes" >> beam.Map(lambda r: (r[0], r[3])),
            )
            | "AllTimes" >> beam.Flatten()
            | "NewestPerEdge" >> beam.CombinePerKey(max)
            | "EdgeWatermarks" >> beam.MapTuple(lambda edge, newest_us: (edge, newest_us - lateness))
        )
        failures = (
            events
            | "Failures" >> beam.Filter(lambda r: failure_kind(r[4]) is not None)
            | "KeyFailures" >> beam.Map(lambda r: (r[2], (r[3], failure_kind(r[4]))))
        )
        keyed = predictions | "KeyPredictions" >> beam.Map(lambda r: (r[2], r))
        return (
            {"predictions": keyed, "failures": failures}
            | "JoinFailures" >> beam.CoGroupByKey()
            | "LabelMachines" >> beam.ParDo(LabelMachine(), watermarks=beam.pvalue.AsDict(newest))
        )


class ReadParquetRows(beam.PTransform):
    """A Parquet file -> its rows as tuples, stamped with the event time in column ``time_column``."""

    def __init__(self, path: str, time_column: int) -> None:
        super().__init__()
        self._path = path
        self._time_column = time_column

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        column = self._time_column
        return (
            pbegin
            | "ReadParquet" >> beam.io.ReadFromParquetBatched(self._path)
            | "ToRows" >> beam.FlatMap(_rows)
            | "StampEventTime" >> beam.Map(lambda r: TimestampedValue(r, Timestamp(micros=r[column])))
        )


@dataclass
class LabelingReport:
    """What one labeling run did."""

    predictions: int = 0
    events: int = 0
    examples: int = 0  # final examples in the days written
    pending: int = 0  # predictions whose outcome was still open
    outcomes: dict[str, int] = field(default_factory=dict)
    days: list[str] = field(default_factory=list)
    days_rewritten: list[str] = field(default_factory=list)
    dataset: Path | str | None = None
    seconds: float = 0.0


def write_manifest(dataset: Path | str, settings: ObjectStoreSettings | None = None) -> None:
    manifest = {"format": DATASET_FORMAT, "label_rule": LABEL_RULE, "partitioning": "hive: day=YYYY-MM-DD"}
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    with explained(dataset, settings):
        fs, path = filesystem(join(dataset, "_dataset.json"), settings)
        if _read_bytes(fs, path) != data:
            if is_local(fs):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            fs.pipe_file(path, data)


def dataset_exists(dataset: Path | str, settings: ObjectStoreSettings | None = None) -> bool:
    """Whether the dataset is there: a local folder, or any object under the URL's prefix."""
    fs, root = filesystem(dataset, settings)
    if is_local(fs):
        return Path(root).is_dir()
    return bool(fs.find(root))  # a fresh listing: an object store has no folders, only keys under a prefix


def day_files(dataset: Path | str, settings: ObjectStoreSettings | None = None) -> list[str]:
    """Every day file of the dataset, sorted: local paths, or URLs for a dataset on an object store."""
    fs, root = filesystem(dataset, settings)
    root = root.rstrip("/")
    # find lists every key under the prefix afresh; glob would walk listings cached before the days were written.
    found = sorted(path for path in fs.find(root) if _DAY_FILE.fullmatch(path[len(root) + 1 :]))
    return found if is_local(fs) else [fs.unstrip_protocol(path) for path in found]


def _read_bytes(fs: AbstractFileSystem, path: str) -> bytes | None:
    """A file's bytes, or None when there is none (asked of the store itself, never of a cached listing)."""
    try:
        return fs.cat_file(path)
    except FileNotFoundError:
        return None


def dataset_glob(dataset: str | Path) -> str | None:
    """The file pattern of a local dataset's day files, or ``None`` while it has none."""
    return str(Path(dataset) / DAY_FILES) if any(Path(dataset).glob(DAY_FILES)) else None


def read_day_file(path: str, settings: ObjectStoreSettings | None = None) -> pa.Table:
    """One day file (a local path or a URL) as a table of the dataset's schema."""
    fs, inside = filesystem(as_location(path), settings)
    if is_local(fs):
        return pq.read_table(inside, schema=SCHEMA)
    with explained(path, settings):
        data = fs.cat_file(inside)
    return read_parquet_bytes(data, SCHEMA)


def read_dataset(dataset: str | Path, settings: ObjectStoreSettings | None = None) -> pa.Table:
    """Every example of a labeled dataset (a folder or a URL) as one table (without the ``day`` partition column)."""
    files = day_files(as_location(dataset), settings)
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables(read_day_file(f, settings) for f in files)


def run_labeling(
    store_path: str | Path,
    dataset: str | Path,
    *,
    settings: PipelineSettings | None = None,
    runner: str = LOCAL,
    beam_args: list[str] | None = None,
    engine_settings: EngineSettings | None = None,
) -> LabelingReport:
    """Label every stored prediction whose outcome is decided, into the Parquet dataset at ``dataset`` (a folder or
    an object store URL, reached with the object store settings of the environment)."""
    started = time.monotonic()
    settings = settings or PipelineSettings()
    dataset = as_location(dataset)
    if isinstance(dataset, Path):
        dataset.mkdir(parents=True, exist_ok=True)
    else:
        filesystem(dataset)  # reaches the store: one that refuses stops the run here, not inside a Beam worker
    report = LabelingReport(dataset=dataset)
    with tempfile.TemporaryDirectory(prefix="labeling-", dir=settings.work_dir) as work:
        snapshot = take_snapshot(store_path, work)
        report.predictions, report.events = snapshot.prediction_count, snapshot.event_count
        if snapshot.prediction_count == 0:
            report.seconds = time.monotonic() - started
            return report
        results = Path(work) / "days"
        pipeline = engine(runner, beam_args, engine_settings).pipeline()
        predictions = pipeline | "ReadPredictions" >> ReadParquetRows(
            str(snapshot.predictions), StoredPrediction._fields.index("window_end_us")
        )
        events = pipeline | "ReadEvents" >> ReadParquetRows(str(snapshot.events), StoredEvent._fields.index("at_us"))
        _ = (
            {"predictions": predictions, "events": events}
            | "LabelPredictions" >> LabelPredictions(settings.allowed_lateness_s * MICROS)
            | "KeyByDay" >> beam.Map(lambda e: (day_of(e[2]), e))
            | "GroupByDay" >> beam.GroupByKey()
            | "WriteDays" >> beam.ParDo(WriteDay(describe(dataset)))
            | "DescribeDays" >> beam.MapTuple(lambda day, rows, changed: json.dumps([day, rows, changed]))
            | "WriteDayList" >> beam.io.WriteToText(str(results), shard_name_template="")
        )
        result = pipeline.run()
        result.wait_until_finish()
        report.pending = counters(result, NAMESPACE).get("examples.pending", 0)
        written = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    write_manifest(dataset)
    report.days = sorted(day for day, _, _ in written)
    report.days_rewritten = sorted(day for day, _, changed in written if changed)
    table = read_dataset(dataset)
    report.examples = table.num_rows
    for outcome in table.column("outcome").to_pylist():
        report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
    report.outcomes = dict(sorted(report.outcomes.items()))
    report.seconds = time.monotonic() - started
    return report
