"""Training a candidate from labeled windows (the evidence the pipelines collect), not from the generic files.

:func:`models.train.train` reads telemetry and event files and splits them itself; the retrain flow already holds
labeled windows, so it splits those the same way and hands them to :func:`models.train.train_on_windows`: what it
trains is exactly what ``precursor train`` would.

The validation period follows :func:`models.dataset.choose_split`: the end of the evidence, holding the last
``max(min_validation_failures, validation_fraction x failures)`` failures and starting one horizon before the first
of them; training windows are those whose labels were known by then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.dataset import HOUR_S, DatasetError, LabeledWindow
from models.train import TrainResult, TrainSettings, train_on_windows


@dataclass(frozen=True)
class LabeledFailure:
    machine_id: str
    time_s: int
    kind: str


def labeled_failures(windows: Sequence[LabeledWindow]) -> list[LabeledFailure]:
    """The distinct failures the windows' labels point at, oldest first."""
    found = {
        (w.window.machine_id, round(w.end_s + w.hours_to_failure * HOUR_S), w.outcome)
        for w in windows
        if w.failed and w.hours_to_failure is not None
    }
    return [LabeledFailure(m, t, k) for m, t, k in sorted(found, key=lambda f: (f[1], f[0], f[2]))]


def label_known_by(window: LabeledWindow, instant_s: int, horizon_h: float) -> bool:
    """Whether the window's label was settled before ``instant_s``: its failure happened, or its horizon passed."""
    if window.failed and window.hours_to_failure is not None:
        return window.end_s + window.hours_to_failure * HOUR_S < instant_s
    return window.end_s + horizon_h * HOUR_S <= instant_s


def split_for_validation(
    windows: Sequence[LabeledWindow], horizon_h: float, *, fraction: float, min_failures: int
) -> tuple[list[LabeledWindow], list[LabeledWindow]]:
    """(training, validation) windows: validation at the end holds several failures; no training label leaks."""
    failures = labeled_failures(windows)
    needed = max(min_failures, math.ceil(fraction * len(failures)))
    if len(failures) < needed + 1:
        raise DatasetError(
            f"the evidence holds {len(failures)} failure(s): training needs at least {needed + 1} "
            f"({needed} for the validation period, at least one to learn from)"
        )
    validation_from = int(failures[-needed].time_s - horizon_h * HOUR_S)
    train = [w for w in windows if w.end_s < validation_from and label_known_by(w, validation_from, horizon_h)]
    validation = [w for w in windows if w.end_s >= validation_from]
    return train, validation


def train_candidate_on(
    windows: Sequence[LabeledWindow], out: str | Path, settings: TrainSettings, *, data: dict[str, Any] | None = None
) -> TrainResult:
    """Split the evidence's training windows in time, then train exactly as ``precursor train`` does."""
    train, validation = split_for_validation(
        windows,
        settings.horizon_h,
        fraction=settings.validation_fraction,
        min_failures=settings.min_validation_failures,
    )
    return train_on_windows(train, validation, out, settings, data=data)
