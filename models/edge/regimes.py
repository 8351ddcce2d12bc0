"""Operating regimes: readings that fall into a few tight clusters, each sensor measured against its own cluster.

A turbofan flown at six altitude and throttle settings (C-MAPSS FD002/FD004) reads six sets of sensor values; which
set a reading belongs to changes from one cycle to the next. Scaled per sensor over the whole fleet, that jump is most
of what a window's statistics see, and the slow drift that precedes a failure is lost in it. Measured within its
regime, each sensor shows the drift again.

Whether a fleet has regimes is read from its training rows, not set per dataset: k-means on the scaled readings with
eight clusters must explain at least 95 % of their variance (readings clipped to ten spreads). On the quality suite's
fleets that separates cleanly: C-MAPSS FD004 0.98; FD001 0.67, FD003 0.75, the Backblaze drives 0.59 and the
simulator's four profiles 0.81-0.87. On FD004 the LM's test PR-AUC rose from 0.261 to 0.786 (seed 0, 6 minutes).
The number of regimes is then the smallest whose clusters explain 97 % of what eight explain (five on FD004).

Fitting needs scikit-learn (training only); assigning a reading to its regime is numpy, as the edge needs.

>>> rng = np.random.default_rng(0)
>>> modes = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
>>> rows = modes[rng.integers(0, 3, 3000)] + rng.normal(0, 0.1, (3000, 2))
>>> regimes = Regimes.detect(rows)
>>> len(regimes.centroids)
3
>>> bool(np.all(np.abs(np.nanmedian(regimes.apply(rows), axis=0)) < 0.2))
True
>>> Regimes.detect(rng.normal(0, 1, (3000, 2))) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

MAX_REGIMES = 8
MIN_EXPLAINED = 0.95
"""Share of the variance that :data:`MAX_REGIMES` clusters must explain for a fleet to have regimes."""
SHARE_OF_BEST = 0.97
SAMPLE_ROWS = 5_000
CLIP = 10.0
"""Scaled readings count at most this far from the centre when regimes are found and assigned."""


@dataclass(frozen=True)
class Regimes:
    """``centroids`` ``(K, S)`` assign each scaled reading its regime; ``scales`` ``(K, S)`` are each regime's
    robust spread per sensor. ``apply`` returns ``(scaled - centroid) / scale`` of each row's regime."""

    centroids: np.ndarray
    scales: np.ndarray

    @classmethod
    def detect(cls, scaled: np.ndarray, *, seed: int = 0) -> Regimes | None:
        """The regimes of ``scaled`` rows ``(N, S)``, or None when they do not fall into tight clusters."""
        from sklearn.cluster import KMeans  # training only: the edge install has no scikit-learn

        # Clipped: a sensor with a near-zero spread and a few far readings would otherwise hold all the variance, and
        # two "regimes" (its outliers and the rest) would explain it.
        complete = np.clip(scaled[np.isfinite(scaled).all(axis=1)], -CLIP, CLIP)
        if len(complete) < 20 * MAX_REGIMES or complete.shape[1] < 2:
            return None
        rng = np.random.default_rng(seed)
        sample = complete[rng.choice(len(complete), min(SAMPLE_ROWS, len(complete)), replace=False)]
        total = float(((sample - sample.mean(axis=0)) ** 2).sum())
        if total <= 0:
            return None
        most = KMeans(MAX_REGIMES, n_init=3, random_state=seed).fit(sample)
        if 1.0 - float(most.inertia_) / total < MIN_EXPLAINED:
            return None  # one fit decides it for most fleets: no regimes
        fits = {k: KMeans(k, n_init=3, random_state=seed).fit(sample) for k in range(2, MAX_REGIMES)}
        fits[MAX_REGIMES] = most
        explained = {k: 1.0 - float(fit.inertia_) / total for k, fit in fits.items()}
        k = min(k for k, share in explained.items() if share >= SHARE_OF_BEST * explained[MAX_REGIMES])
        centroids = np.asarray(fits[k].cluster_centers_, dtype=np.float64)
        labels = _nearest(complete, centroids)
        scales = np.ones_like(centroids)
        for r in range(k):
            members = complete[labels == r]
            if len(members) >= 2:
                q75, q25 = np.percentile(members, [75, 25], axis=0)
                spread = (q75 - q25) / 1.349
                std = members.std(axis=0)
                spread = np.where(spread > 0, spread, std)
                scales[r] = np.where(spread > 0, spread, 1.0)
        return cls(centroids, scales)

    def apply(self, scaled: np.ndarray) -> np.ndarray:
        """Each row measured within its regime; NaN stays NaN (a row's regime is read from its present sensors)."""
        regime = _nearest(scaled, self.centroids)
        return (scaled - self.centroids[regime]) / self.scales[regime]

    def to_json(self) -> dict[str, object]:
        return {"centroids": [_floats(c) for c in self.centroids], "scales": [_floats(s) for s in self.scales]}

    @classmethod
    def from_json(cls, data: Mapping[str, object], sensors: int) -> Regimes:
        centroids = np.array(data["centroids"], dtype=np.float64)
        scales = np.array(data["scales"], dtype=np.float64)
        shape = (len(centroids), sensors)
        if centroids.ndim != 2 or centroids.shape != shape or scales.shape != shape or not len(centroids):
            raise ValueError(f"regimes must be two K x {sensors} matrices")
        if not (np.isfinite(centroids).all() and np.isfinite(scales).all() and (scales > 0).all()):
            raise ValueError("regime centroids must be finite and their scales positive")
        return cls(centroids, scales)


def _nearest(rows: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid per row, over the sensors the row has (a row with none: regime 0)."""
    present = np.isfinite(rows)
    filled = np.clip(np.where(present, rows, 0.0), -CLIP, CLIP)
    # sum over present sensors of (x - c)^2 = sum x^2 - 2 x.c + sum over present of c^2
    distance = (
        (filled**2).sum(axis=1)[:, None] - 2.0 * filled @ centroids.T + present.astype(np.float64) @ (centroids**2).T
    )
    return np.argmin(distance, axis=1)


def _floats(values: np.ndarray) -> list[float]:
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise ValueError("regimes must be finite")
    return out
