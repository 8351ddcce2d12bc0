"""Baselines that need no language model: the bar the LM must clear, and the edge agent's fallback scorer.

:class:`DriftZScore` is honest about what it is: it measures how far a machine's latest readings have drifted from
that machine's own early readings (its reference), and maps the mean absolute z-score to a risk with a logistic curve.
It learns nothing about failures; it only says "this machine no longer looks like it did".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.scoring import ANY_FAILURE, Risk, Window


@dataclass
class DriftZScore:
    """Risk from drift against the machine's own first ``reference_points`` readings in the window.

    >>> import numpy as np
    >>> from datetime import datetime, UTC
    >>> steady = np.ones((20, 2), dtype=np.float32) + np.random.default_rng(0).normal(0, 0.01, (20, 2))
    >>> drifted = steady.copy(); drifted[-5:] += 1.0
    >>> t = np.arange(20, dtype=np.int64)
    >>> mk = lambda v: Window("m", datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC), t, ("a", "b"), v)
    >>> s = DriftZScore()
    >>> s.score(mk(steady))["failure"] < 0.1 < 0.9 < s.score(mk(drifted))["failure"]
    True
    """

    horizon_h: float = 24.0
    reference_points: int = 10
    recent_points: int = 5
    midpoint: float = 3.0
    steepness: float = 1.5
    name: str = "drift-zscore"
    version: str = "1"

    def score(self, window: Window) -> Risk:
        values = window.values.astype(np.float64)
        if len(values) < 2:
            return {ANY_FAILURE: 0.0}
        ref = values[: max(1, min(self.reference_points, len(values) - 1))]
        recent = values[-min(self.recent_points, len(values)) :]
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            # A sensor that never reported gives an all-NaN column: expected, not worth a warning.
            warnings.simplefilter("ignore", category=RuntimeWarning)
            mean = np.nanmean(ref, axis=0)
            std = np.nanstd(ref, axis=0)
            scale = np.where(np.isfinite(std) & (std > 1e-9), std, np.nan)
            z = np.abs(np.nanmean(recent, axis=0) - mean) / scale
            z = z[np.isfinite(z)]
        if z.size == 0:
            return {ANY_FAILURE: 0.0}
        drift = float(np.mean(np.minimum(z, 50.0)))
        return {ANY_FAILURE: 1.0 / (1.0 + math.exp(-self.steepness * (drift - self.midpoint)))}

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        return [self.score(w) for w in windows]
