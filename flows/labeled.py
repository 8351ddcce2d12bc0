"""The evidence: the labeling pipeline's examples joined with the telemetry windows they point at.

The labeled dataset (:mod:`pipelines.labeling`) holds one row per final prediction: the machine, the window's end, the
outcome the field reported and the lead time to the first failure. The window's readings stay at the edge by
default and reach training as generic-format files; :func:`models.training.dataset.build_windows` cuts windows from them
by the edge's rule, and the join on ``(machine_id, window_end)`` gives each example the model's exact input. The
labels are the field's (they win over the files' events where the two differ); the windows' context (errors,
maintenance) is the files'.

Rows without telemetry (a machine or a time the files do not cover) are counted and left out, never guessed.

The dataset is a local folder or an object store URL (``s3://bucket/labeled``); see
:mod:`precursor.contracts.object_store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from models.training.dataset import HOUR_S, DatasetError, Fleet, LabeledWindow, WindowSpec, build_windows
from pipelines.labeling import (
    Example,
    dataset_exists,
    day_of,
    examples_table,
    read_dataset,
    write_day,
    write_manifest,
)
from precursor.contracts.object_store import ObjectStoreSettings, as_location, describe

MICROS = 1_000_000


@dataclass(frozen=True)
class LabeledWindows:
    windows: list[LabeledWindow]
    rows: int
    """Labeled rows read (distinct machine and window end)."""
    without_telemetry: int
    """Rows the telemetry files hold no window for."""


def field_labels(
    dataset: Path | str, settings: ObjectStoreSettings | None = None
) -> dict[tuple[str, int], tuple[str, float | None]]:
    """``(machine_id, window_end_s) -> (outcome, lead_time_h)`` for every example; the first row wins on repeats."""
    dataset = as_location(dataset)
    if not dataset_exists(dataset, settings):
        what = "a folder" if isinstance(dataset, Path) else "there"
        raise DatasetError(f"labeled_dataset={describe(dataset)!r} is not {what} (run the labeling pipeline first)")
    table = read_dataset(dataset, settings)
    ends = pc.divide(table.column("window_end").cast(pa.int64()), MICROS).to_pylist()
    labels: dict[tuple[str, int], tuple[str, float | None]] = {}
    for machine_id, end_s, outcome, lead in zip(
        table.column("machine_id").to_pylist(),
        ends,
        table.column("outcome").to_pylist(),
        table.column("lead_time_h").to_pylist(),
        strict=True,
    ):
        labels.setdefault((machine_id, int(end_s)), (outcome, lead))
    return labels


def read_labeled_windows(
    dataset: Path | str, fleet: Fleet, spec: WindowSpec, settings: ObjectStoreSettings | None = None
) -> LabeledWindows:
    """Every labeled example that the fleet's telemetry has a window for, with the field's label."""
    labels = field_labels(dataset, settings)
    if not labels:
        return LabeledWindows([], 0, 0)
    first = min(end for _, end in labels)
    last = max(end for _, end in labels)
    cut = build_windows(
        fleet,
        spec,
        ends_from_s=first,
        ends_before_s=last + 1,
        # Labels come from the field: no window may be dropped as "still open" by the files' own events.
        labels_until_s=last + int(spec.horizon_h * HOUR_S) + 1,
        machines=sorted({machine for machine, _ in labels}),
    )
    windows = []
    for w in cut:
        label = labels.get((w.window.machine_id, w.end_s))
        if label is not None:
            outcome, lead_time_h = label
            windows.append(LabeledWindow(window=w.window, outcome=outcome, hours_to_failure=lead_time_h))
    return LabeledWindows(windows, rows=len(labels), without_telemetry=len(labels) - len(windows))


def write_history(
    windows: Sequence[LabeledWindow],
    dataset: Path | str,
    *,
    horizon_h: float,
    source: str = "history",
    settings: ObjectStoreSettings | None = None,
) -> int:
    """Write windows labeled from historical files into the labeled dataset as examples; returns how many.

    For a fleet with history but no field predictions yet: the evidence then starts with the files' own labels.
    The rows name ``source`` as model and edge and carry no risk, so they never pass for a model's output. Days
    already in the dataset are replaced.
    """
    by_day: dict[str, list[Example]] = {}
    for seq, w in enumerate(windows):
        end_us = w.end_s * MICROS
        failed_at_us = None
        if w.failed and w.hours_to_failure is not None:
            failed_at_us = end_us + round(w.hours_to_failure * HOUR_S * MICROS)
        example = Example(
            machine_id=w.window.machine_id,
            window_start_us=round(w.window.start.timestamp() * MICROS),
            window_end_us=end_us,
            horizon_h=horizon_h,
            outcome=w.outcome,
            failure_kinds=(w.outcome,) if failed_at_us is not None else (),
            failure_kinds_at_us=(failed_at_us,) if failed_at_us is not None else (),
            failure_at_us=failed_at_us,
            lead_time_h=w.hours_to_failure if failed_at_us is not None else None,
            model_name=source,
            model_version="0",
            risk="{}",
            risk_any=0.0,
            edge_id=source,
            seq=seq,
            threshold=None,
        )
        by_day.setdefault(day_of(end_us), []).append(example)
    dataset = as_location(dataset)
    for day, examples in sorted(by_day.items()):
        write_day(examples_table(examples), dataset, day, settings)
    write_manifest(dataset, settings)
    return sum(len(v) for v in by_day.values())
