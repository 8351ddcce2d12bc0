"""Calibration: turning the model's whole-failure risk into a probability that matches how often failures come.

A language model's outcome distribution is whatever minimised the training loss: trained on a few failures, with
checkpoint selection on PR-AUC, its ``risk["failure"]`` ranks windows well but is not known to be a frequency. After
training, :func:`fit_platt` fits a map on the validation period's risks, and every scorer (the torch checkpoint, the
edge's ONNX runtime, ``precursor evaluate``) applies the same map through :meth:`Calibration.apply`.

Why Platt scaling on the logit, with a prior, rather than isotonic regression or temperature alone:

- validation holds a handful of failures (``min_validation_failures`` is 3): isotonic regression would be a step
  function with a few steps, flat between them, and ties the ranking the alert threshold depends on;
- temperature alone (a slope) cannot move the base rate, and a rare-failure model's risks are mostly off in level;
- two parameters on ``logit(p)``, ``p' = sigmoid(a * logit(p) + b)``, keep the ranking (``a > 0``: the map is strictly
  increasing, so the alert threshold maps to the same operating point), and Platt's smoothed targets
  (``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)``) plus a weak Gaussian prior pulling ``(a, b)`` to ``(1, 0)`` keep the
  fit finite when validation separates perfectly;
- with fewer than :data:`MIN_POSITIVES` failed (or ok) validation windows the fit would be noise: the map stays the
  identity, and says why.

Per kind: ``risk[KIND]`` is ``p(KIND)``, a share of the whole-failure risk. It is scaled by the same factor as the
whole-failure risk, so the kinds keep their proportions and never add up to more than it.

Numpy only: the edge imports this.

>>> c = Calibration(a=0.5, b=-1.0, method="platt")
>>> round(c.probability(0.5), 4), round(c.probability(0.9), 4)
(0.2689, 0.5246)
>>> r = c.apply({"failure": 0.5, "bearing": 0.25})
>>> round(r["failure"], 4), round(r["bearing"], 4)
(0.2689, 0.1345)
>>> Calibration().apply({"failure": 0.3}) == {"failure": 0.3}
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.edge.scoring import Risk
from precursor.contracts.outcomes import ANY_FAILURE

MIN_POSITIVES = 10
"""Failed validation windows (and ok ones) below which the map stays the identity: too few to fit two numbers."""
PRIOR_STRENGTH = 1.0
"""Weight of the Gaussian prior on ``(a - 1, b)``, in units of one window's log-loss: a nudge that keeps a perfectly
separated validation period from driving the slope to infinity, and nothing once there are hundreds of windows."""
EPS = 1e-12
"""Risks are clipped to ``[EPS, 1 - EPS]`` before the logit (0 and 1 have none)."""


class Calibration(BaseModel):
    """``risk' = sigmoid(a * logit(risk) + b)``; the identity is ``a = 1, b = 0`` (``method="identity"``).

    Carried in ``precursor.json`` under ``calibration``, so the artifact's signature covers it; an artifact without
    one loads as the identity.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["identity", "platt"] = "identity"
    a: Annotated[float, Field(gt=0, description="slope on logit(risk); positive, so the map keeps the ranking")] = 1.0
    b: float = 0.0
    fitted_on: Annotated[int, Field(ge=0, description="validation windows the map was fitted on")] = 0
    positives: Annotated[int, Field(ge=0, description="failed windows among them")] = 0
    reason: str = ""
    """Why the map is what it is (which data, or why it stayed the identity)."""

    @property
    def is_identity(self) -> bool:
        return self.method == "identity" or (self.a == 1.0 and self.b == 0.0)

    def probabilities(self, risks: np.ndarray | Sequence[float]) -> np.ndarray:
        """The map on an array of whole-failure risks (float64)."""
        p = np.asarray(risks, dtype=np.float64)
        if self.is_identity:
            return p.copy()
        x = np.log(np.clip(p, EPS, 1 - EPS)) - np.log1p(-np.clip(p, EPS, 1 - EPS))
        return _sigmoid(self.a * x + self.b)

    def probability(self, risk: float) -> float:
        return float(self.probabilities(np.array([risk]))[0])

    def apply(self, risk: Risk) -> Risk:
        """One scorer's risk, calibrated: the whole-failure risk mapped, every kind scaled by the same factor."""
        if self.is_identity:
            return dict(risk)
        raw = float(risk[ANY_FAILURE])
        calibrated = self.probability(raw)
        scale = calibrated / raw if raw > 0 else 0.0
        out = {k: float(v) * scale for k, v in risk.items()}
        out[ANY_FAILURE] = calibrated
        return out

    def apply_many(self, risks: Sequence[Risk]) -> list[Risk]:
        if self.is_identity:
            return [dict(r) for r in risks]
        return [self.apply(r) for r in risks]


IDENTITY = Calibration()


def calibration_of(config: Mapping[str, Any]) -> Calibration:
    """The map a ``precursor.json`` carries; the identity for one made before calibration existed."""
    raw = config.get("calibration")
    if raw is None:
        return IDENTITY
    try:
        return Calibration.model_validate(raw)
    except ValidationError as e:
        raise ValueError(f"precursor.json: 'calibration' is not a valid calibration map: {e}") from e


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


def fit_platt(
    failed: Sequence[bool] | np.ndarray,
    risks: Sequence[float] | np.ndarray,
    *,
    min_positives: int = MIN_POSITIVES,
    prior_strength: float = PRIOR_STRENGTH,
) -> Calibration:
    """The Platt map fitted on validation windows' outcomes and whole-failure risks (Newton's method on the
    penalised log-loss); the identity when there are too few failed or ok windows, or the fit does not rank.

    >>> rng = np.random.default_rng(0)
    >>> truth = rng.uniform(0.01, 0.3, 4000); failed = rng.random(4000) < truth
    >>> over = 1 / (1 + np.exp(-3 * np.log(truth / (1 - truth))))  # over-confident: logit stretched three-fold
    >>> c = fit_platt(failed, over)
    >>> c.method, round(c.a, 1)
    ('platt', 0.3)
    >>> fit_platt([True] * 3 + [False] * 50, [0.9] * 3 + [0.1] * 50).reason
    'identity: 3 failed validation windows, fewer than 10'
    """
    y = np.asarray(failed, dtype=bool)
    p = np.asarray(risks, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"fit_platt: failed {y.shape} and risks {p.shape} must be one value per window")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("fit_platt: risks must be finite probabilities in [0, 1]")
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives < min_positives:
        return Calibration(
            fitted_on=len(y),
            positives=positives,
            reason=f"identity: {positives} failed validation windows, fewer than {min_positives}",
        )
    if negatives < min_positives:
        return Calibration(
            fitted_on=len(y),
            positives=positives,
            reason=f"identity: {negatives} ok validation windows, fewer than {min_positives}",
        )
    x = np.log(np.clip(p, EPS, 1 - EPS)) - np.log1p(-np.clip(p, EPS, 1 - EPS))
    t = np.where(y, (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0))
    theta = np.array([1.0, 0.0])  # start from the identity, where the prior is centred
    prior = np.array([1.0, 0.0])

    def loss(th: np.ndarray) -> float:
        z = th[0] * x + th[1]
        # log(1 + e^z) - t z, stably
        nll = np.sum(np.logaddexp(0.0, z) - t * z)
        return float(nll + 0.5 * prior_strength * np.sum((th - prior) ** 2))

    current = loss(theta)
    for _ in range(100):
        q = _sigmoid(theta[0] * x + theta[1])
        r = q - t
        w = q * (1 - q)
        grad = np.array([np.sum(r * x), np.sum(r)]) + prior_strength * (theta - prior)
        hess = np.array([[np.sum(w * x * x), np.sum(w * x)], [np.sum(w * x), np.sum(w)]])
        hess += prior_strength * np.eye(2)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-8:  # backtracking: a Newton step can overshoot far from the optimum
            candidate = theta - scale * step
            value = loss(candidate)
            if value <= current:
                break
            scale /= 2
        else:
            break
        theta, improvement, current = candidate, current - value, value
        if improvement < 1e-10 * max(1.0, abs(current)):
            break
    a, b = float(theta[0]), float(theta[1])
    if not (np.isfinite(a) and np.isfinite(b)) or a <= 1e-3:
        return Calibration(
            fitted_on=len(y),
            positives=positives,
            reason=f"identity: the fitted slope {a:.3g} does not rank failures above ok windows",
        )
    return Calibration(
        method="platt",
        a=a,
        b=b,
        fitted_on=len(y),
        positives=positives,
        reason=f"Platt scaling on {len(y)} validation windows ({positives} failed)",
    )


# --- measuring calibration ----------------------------------------------------------------------------------------


class ReliabilityBin(BaseModel):
    """One bin of a reliability diagram: predictions in ``[lower, upper)`` (the last bin includes 1)."""

    model_config = ConfigDict(extra="forbid")

    lower: float
    upper: float
    count: int
    mean_predicted: float | None
    observed_rate: float | None


def brier_score(failed: Sequence[bool] | np.ndarray, risks: Sequence[float] | np.ndarray) -> float:
    """Mean squared difference between risk and outcome (0 is perfect; always predicting the base rate r scores
    r(1 - r)).

    >>> brier_score([True, False], [0.8, 0.4])
    0.1
    """
    y = np.asarray(failed, dtype=np.float64)
    p = np.clip(np.asarray(risks, dtype=np.float64), 0.0, 1.0)
    if len(y) == 0:
        raise ValueError("brier_score needs at least one window")
    return float(np.round(np.mean((p - y) ** 2), 15))


def log_loss(failed: Sequence[bool] | np.ndarray, risks: Sequence[float] | np.ndarray) -> float:
    """Mean negative log-likelihood of the outcomes under the risks (``-log risk`` where a window failed, else
    ``-log(1 - risk)``), each probability floored at 1e-7: training picks its checkpoint on it after PR-AUC.

    >>> round(log_loss([True, False], [0.8, 0.4]), 4)
    0.367
    """
    y = np.asarray(failed, dtype=bool)
    p = np.asarray(risks, dtype=np.float64)
    return float(-np.mean(np.log(np.clip(np.where(y, p, 1.0 - p), 1e-7, 1.0))))


def reliability_bins(
    failed: Sequence[bool] | np.ndarray, risks: Sequence[float] | np.ndarray, bins: int = 10
) -> list[ReliabilityBin]:
    """``bins`` equal-width bins over [0, 1]: how many risks fell in each, their mean, and how often those windows
    failed. Equal width, not equal mass, so every model's diagram has the same bins and a rare-failure model's crowd of
    low risks shows as one heavy bin rather than being spread over most of them."""
    if bins < 1:
        raise ValueError(f"bins={bins} must be at least 1")
    y = np.asarray(failed, dtype=bool)
    p = np.clip(np.asarray(risks, dtype=np.float64), 0.0, 1.0)
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    out = []
    for k in range(bins):
        hit = index == k
        n = int(hit.sum())
        out.append(
            ReliabilityBin(
                lower=k / bins,
                upper=(k + 1) / bins,
                count=n,
                mean_predicted=float(p[hit].mean()) if n else None,
                observed_rate=float(y[hit].mean()) if n else None,
            )
        )
    return out


def expected_calibration_error(
    failed: Sequence[bool] | np.ndarray, risks: Sequence[float] | np.ndarray, bins: int = 10
) -> float:
    """ECE over :func:`reliability_bins`: ``sum_b n_b / N * |mean risk_b - failure rate_b|``.

    >>> expected_calibration_error([True, False, False, False], [0.9, 0.1, 0.1, 0.1])
    0.1
    """
    table = reliability_bins(failed, risks, bins)
    total = sum(b.count for b in table)
    if total == 0:
        raise ValueError("expected_calibration_error needs at least one window")
    gap = sum(b.count * abs(b.mean_predicted - b.observed_rate) for b in table if b.count)  # type: ignore[operator]
    return float(round(gap / total, 12))
