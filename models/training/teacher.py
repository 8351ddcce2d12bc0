"""A teacher for the LM: gradient boosting's out-of-fold risk of each training window, as a soft target.

Why: a fleet has few failures, and a window's hard label says only which side of the horizon it fell. Trees fitted on
the window statistics, the ages and the error counts turn the same labels into a graded risk per window, and where the
trees read something the LM does not learn from a few hundred failed windows (the hours since maintenance, on the
simulated fleets: BENCHMARKS.md, "What the trees read that the LM does not"), that risk says it on every window.
The LM still learns the hard labels; ``TrainSettings.teacher_weight`` weighs the soft ones beside them.

Out of fold, by machine: the risk of a machine's windows comes from trees that never saw that machine, so it is what
the trees would say of a machine they do not know, not a copy of the labels they learned. Training only: the edge
runs the LM alone, and this module needs scikit-learn.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from models.edge.baselines import baseline_features, boosted_trees
from models.edge.features import feature_matrix
from models.training.dataset import LabeledWindow

log = logging.getLogger(__name__)

TEACHER_FOLDS = 4


def machine_folds(machine_ids: Sequence[str], folds: int, seed: int) -> np.ndarray:
    """``(N,)`` the fold of each window: every window of a machine in the same one, machines dealt at random."""
    machines = sorted(set(machine_ids))
    order = np.random.default_rng(seed).permutation(len(machines))
    fold_of = {machines[j]: rank % folds for rank, j in enumerate(order)}
    return np.array([fold_of[m] for m in machine_ids], dtype=np.int64)


def teacher_risks(
    windows: Sequence[LabeledWindow],
    tokenizer_settings: Mapping[str, Any],
    *,
    seed: int = 0,
    folds: int = TEACHER_FOLDS,
) -> np.ndarray:
    """``(N,)`` float32: each window's failure risk from gradient boosting fitted on the other machines' windows.

    The features are the baseline's (:func:`models.edge.baselines.baseline_features`, with the LM's tokenizer
    settings). A fold whose other machines hold no failed window (or no ok one) gets their base rate; a fleet of one
    machine, the base rate of its own windows.
    """
    plain = [w.window for w in windows]
    labels = np.array([w.failed for w in windows], dtype=np.int64)
    spec = baseline_features(plain, tokenizer_settings)
    features = feature_matrix(plain, spec)
    fold = machine_folds([w.machine_id for w in plain], min(folds, len({w.machine_id for w in plain})), seed)
    risks = np.zeros(len(windows), dtype=np.float32)
    for k in np.unique(fold):
        held, fitted = fold == k, fold != k
        known = labels[fitted]
        if known.min(initial=1) == known.max(initial=0):
            risks[held] = float(known.mean()) if known.size else float(labels.mean())
            continue
        # Columns some fitted window defines: the trees cannot split on one that is never there.
        columns = np.flatnonzero(np.isfinite(features[fitted]).any(axis=0))
        trees = boosted_trees(seed=seed)
        trees.fit(features[fitted][:, columns], known)
        risks[held] = trees.predict_proba(features[held][:, columns])[:, 1]
    log.info("teacher: %d windows, %d folds, mean risk %.4f", len(windows), len(np.unique(fold)), risks.mean())
    return risks
