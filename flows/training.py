"""Training a candidate from labeled windows (the evidence the pipelines collect), not from the generic files.

:func:`models.training.train.train` reads telemetry and event files and splits them itself; the retrain flow already
holds labeled windows, so it splits those by the same rule (:func:`models.training.dataset.split_for_validation`) and
hands them to :func:`models.training.train.train_on_windows`: what it trains is exactly what ``precursor train``
would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.training.dataset import LabeledWindow, split_for_validation
from models.training.train import TrainResult, TrainSettings, train_on_windows


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
