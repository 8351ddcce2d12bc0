"""The evidence a retrain learns from and is judged on: labeled windows, cut in time into training and held out.

The held-out window is the most recent ``holdout_h`` hours of the evidence (windows ending in it); candidate and
champion are both judged there. Training uses only windows whose labels were settled before the held-out window
starts, so nothing the judges look at leaks into what the candidate learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from models.training.dataset import HOUR_S, DatasetError, LabeledWindow, label_known_by


@dataclass(frozen=True)
class Evidence:
    training: list[LabeledWindow]
    held_out: list[LabeledWindow]
    held_out_from_s: int
    until_s: int


def split_evidence(windows: Sequence[LabeledWindow], *, holdout_h: float, horizon_h: float) -> Evidence:
    """Held out: windows ending in the last ``holdout_h`` hours; training: windows labeled before that began."""
    if not windows:
        raise DatasetError("the labeled dataset holds no windows: nothing to train or judge on")
    until = max(w.end_s for w in windows) + 1
    held_out_from = int(until - holdout_h * HOUR_S)
    held_out = [w for w in windows if w.end_s >= held_out_from]
    training = [w for w in windows if w.end_s < held_out_from and label_known_by(w, held_out_from, horizon_h)]
    if not training:
        raise DatasetError(
            f"no labeled window was settled before the held-out window starts ({holdout_h:g} h before the end of "
            "the evidence): collect more, or shorten holdout_h"
        )
    return Evidence(training=training, held_out=held_out, held_out_from_s=held_out_from, until_s=until)
