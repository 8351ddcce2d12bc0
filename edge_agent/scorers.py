"""Choosing the scorer an agent runs, from its config."""

from __future__ import annotations

from edge_agent.config import ModelSpec
from models.baselines import DriftZScore
from models.scoring import Scorer


def load_scorer(spec: ModelSpec) -> Scorer:
    """The drift baseline, or the signed language model artifact (verified before it is loaded)."""
    horizon_h = spec.horizon.total_seconds() / 3600
    if spec.type == "drift-zscore":
        return DriftZScore(horizon_h=horizon_h)
    from models.runtime import LMScorer  # onnxruntime is only needed when the LM runs

    assert spec.artifact is not None
    return LMScorer.load(spec.artifact, trusted_keys=spec.trusted_keys, threads=spec.threads)
