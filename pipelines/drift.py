"""Distribution drift as the population stability index (PSI), and the histograms it compares.

``PSI = sum over bins of (observed - reference) * ln(observed / reference)``, on the share of observations per bin.
By the usual reading, below 0.1 nothing moved, 0.1 to 0.25 something did, above 0.25 the population has changed.
Empty bins are smoothed with a small floor so a bin that is new (an error code never seen in training) counts as a
large change instead of an infinite one.

The features monitored, each a histogram per model version and window:

- ``max_risk``: the model's output, in ten bins of width 0.1. Output drift: the model sees something different, or
  the fleet has changed.
- ``top_kind``: which failure kind the model rates highest.
- ``events``: the fleet's event stream (error codes, maintenance, failures), which the model reads as context
  tokens: input drift, per fleet (model ``*``).

A reference is the training set's histogram (build one with :func:`histogram` from the training data and save it as a
:class:`DriftReference`) or, without one, each model version's first monitoring window: drift since deployment.

>>> round(psi({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}), 6)
0.0
>>> round(psi({"a": 0.5, "b": 0.5}, {"a": 0.9, "b": 0.1}), 3)
0.879
>>> risk_bin(0.73), risk_bin(1.0)
('0.7', '0.9')
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

SMOOTHING = 1e-4
FEATURES = ("max_risk", "top_kind", "events")


def risk_bin(risk: float) -> str:
    """The lower edge of the tenth a risk falls in; 1.0 joins the top bin."""
    return f"{min(int(risk * 10), 9) / 10:.1f}"


def histogram(values: Iterable[str]) -> dict[str, float]:
    """Shares per value, summing to 1 (empty input: an empty histogram)."""
    counts = Counter(values)
    total = sum(counts.values())
    return {k: v / total for k, v in sorted(counts.items())} if total else {}


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()} if total else {}


def psi(reference: Mapping[str, float], observed: Mapping[str, float]) -> float:
    """PSI of ``observed`` against ``reference`` (counts or shares; each is normalised first)."""
    ref, obs = shares(reference), shares(observed)
    if not ref or not obs:
        return 0.0
    total = 0.0
    for key in set(ref) | set(obs):
        r = max(ref.get(key, 0.0), SMOOTHING)
        o = max(obs.get(key, 0.0), SMOOTHING)
        total += (o - r) * math.log(o / r)
    return total


class DriftReference(BaseModel):
    """Reference histograms per feature (``max_risk``, ``top_kind``, ``events``), e.g. from the training set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    features: dict[str, dict[str, float]] = Field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DriftReference:
        return cls.model_validate_json(Path(path).read_text())
