"""Baselines that need no language model: the bar the LM must clear, and the edge agent's fallback scorer.

- :class:`DriftZScore`: unsupervised drift against the window's own start (the edge fallback; needs no training).
- :class:`ZScoreRule`: a threshold rule on z-scores against healthy training windows.
- :class:`GradientBoostingBaseline`: gradient boosting on window statistics (the strong baseline).

:class:`DriftZScore` is honest about what it is: it measures how far a machine's latest readings have drifted from
that machine's own early readings (its reference), and maps the mean absolute z-score to a risk with a logistic curve.
It learns nothing about failures; it only says "this machine no longer looks like it did".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.edge.features import HOUR_S, FeatureSpec, block_statistics, feature_matrix
from models.edge.scoring import Risk, Window
from precursor.contracts.outcomes import ANY_FAILURE


def z_risk(z: np.ndarray, *, midpoint: float, steepness: float) -> Risk:
    """Per-sensor z-scores as a risk: their mean (over the sensors that have one, each capped at 50) on a logistic
    curve that crosses 0.5 at ``midpoint``; 0 where no sensor has one."""
    z = z[np.isfinite(z)]
    if z.size == 0:
        return {ANY_FAILURE: 0.0}
    drift = float(np.mean(np.minimum(z, 50.0)))
    return {ANY_FAILURE: 1.0 / (1.0 + math.exp(-steepness * (drift - midpoint)))}


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
        return z_risk(z, midpoint=self.midpoint, steepness=self.steepness)

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        return [self.score(w) for w in windows]


@dataclass
class ZScoreRule:
    """The threshold rule: how far the window's latest block sits from healthy training windows, in z-scores.

    Fitted on training windows labelled ok: per sensor, the mean and standard deviation of the last block's mean
    (values scaled as the tokenizer scales them). The score is the mean absolute z over sensors, mapped to (0, 1)
    with a logistic curve; the alert threshold is chosen on validation like every other scorer's.
    """

    spec: FeatureSpec
    horizon_h: float = 24.0
    midpoint: float = 3.0
    steepness: float = 1.5
    name: str = "zscore"
    version: str = "1"
    _mean: np.ndarray | None = None
    _std: np.ndarray | None = None

    def fit(self, windows: Sequence[Window], failed: Sequence[bool]) -> None:
        healthy = [w for w, f in zip(windows, failed, strict=True) if not f]
        if not healthy:
            raise ValueError("ZScoreRule.fit needs at least one training window labelled ok")
        latest = np.stack([self._latest(w) for w in healthy])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            self._mean = np.nanmean(latest, axis=0)
            self._std = np.nanstd(latest, axis=0)

    def _latest(self, window: Window) -> np.ndarray:
        values = self.spec.scaled(window)
        stats = block_statistics(
            values,
            window.timestamps,
            end_s=int(window.end.timestamp()),
            window_s=self.spec.window_h * HOUR_S,
            blocks=self.spec.blocks,
        )
        return stats["mean"][-1]

    def score(self, window: Window) -> Risk:
        if self._mean is None or self._std is None:
            raise RuntimeError("ZScoreRule is not fitted: call fit(windows, failed) first")
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            z = np.abs(self._latest(window) - self._mean) / np.where(self._std > 1e-9, self._std, np.nan)
        return z_risk(z, midpoint=self.midpoint, steepness=self.steepness)

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        return [self.score(w) for w in windows]


def baseline_features(windows: Sequence[Window], tokenizer: Mapping[str, Any]) -> FeatureSpec:
    """The baselines' features for an LM whose tokenizer settings are ``tokenizer`` (as saved in its checkpoint):
    the same window, blocks and scaling, fitted on the same training windows, so both read the same numbers."""
    return FeatureSpec.from_training(
        windows,
        window_h=float(tokenizer["window_h"]),
        blocks=int(tokenizer.get("blocks", 4)),
        per_machine=tokenizer.get("scaling", "machine") == "machine",
        daily_profile=bool(tokenizer.get("daily_profile", False)),
        residual=bool(tokenizer.get("residual", False)),
        regimes=bool(tokenizer.get("regimes", False)),
        restart_at_failure=bool(tokenizer.get("restart_at_failure", False)),
    )


def boosted_trees(*, seed: int = 0, max_iter: int = 300, learning_rate: float = 0.05) -> Any:
    """The baseline's classifier, unfitted: small, regularised trees (few failures, many correlated windows)."""
    from sklearn.ensemble import HistGradientBoostingClassifier  # cloud only: the edge install has no sklearn

    return HistGradientBoostingClassifier(
        max_iter=max_iter,
        learning_rate=learning_rate,
        max_leaf_nodes=15,
        min_samples_leaf=40,
        l2_regularization=1.0,
        early_stopping=False,
        random_state=seed,
    )


@dataclass
class GradientBoostingBaseline:
    """A feature-based classifier: gradient boosted trees on window statistics, context and attributes.

    The features are :func:`models.edge.features.feature_vector`: per sensor the whole-window mean, std, slope, last,
    min and max, per-block mean, std and slope, hours since maintenance and failure, error counts and numeric
    attributes. Missing values stay NaN (the trees route them).
    """

    spec: FeatureSpec
    horizon_h: float = 24.0
    seed: int = 0
    max_iter: int = 300
    learning_rate: float = 0.05
    name: str = "gradient-boosting"
    version: str = "1"
    _model: Any = None
    _columns: np.ndarray | None = None

    def fit(self, windows: Sequence[Window], failed: Sequence[bool]) -> None:
        labels = np.asarray(failed, dtype=np.int64)
        if labels.min(initial=1) == labels.max(initial=0):
            raise ValueError("GradientBoostingBaseline.fit needs both failed and ok training windows")
        model = boosted_trees(seed=self.seed, max_iter=self.max_iter, learning_rate=self.learning_rate)
        features = feature_matrix(windows, self.spec)
        # A feature never defined in training (no maintenance, no errors seen) cannot be split on: leave it out.
        self._columns = np.flatnonzero(np.isfinite(features).any(axis=0))
        model.fit(features[:, self._columns], labels)
        self._model = model

    def score(self, window: Window) -> Risk:
        return self.score_many([window])[0]

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        if self._model is None:
            raise RuntimeError("GradientBoostingBaseline is not fitted: call fit(windows, failed) first")
        if not windows:
            return []
        p = self._model.predict_proba(feature_matrix(windows, self.spec)[:, self._columns])[:, 1]
        return [{ANY_FAILURE: float(v)} for v in p]
