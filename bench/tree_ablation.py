"""What the trees read that the LM does not: gradient boosting with feature groups taken away, on the suite's fleets.

For each dataset of the quality suite (the same windows and split as ``bench/quality_suite.py``, the defaults'
tokenizer settings), the baseline's classifier is fitted again on variants of its own features, and each variant's
test PR-AUC printed beside the full baseline's:

- without a group (ages, error counts, attributes, per-block statistics, whole-window statistics), and that group alone;
- the ages (hours since each part's maintenance and since the last failure) cut into the LM's fixed age bins, or into
  ``--age-bins`` quantiles of the training ages;
- only what the LM's tokens carry (its block and window statistics and the context), unquantized and cut into
  ``bins`` training quantiles as its tokens are;
- that LM-visible set plus one more statistic at a time.

A group whose removal costs the trees much is information the LM must read well; a statistic that adds much to the
LM-visible set is one its tokens leave out. Gradient boosting is deterministic for a seed, so one seed suffices; the
LM's figures are in the suite's own table.

    .venv/bin/python bench/tree_ablation.py --only sim_slow_degradation,sim_daily,sim_server_metrics,cmapss_fd004
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality_suite import DATASETS, DEFAULT_DATASETS, prepare, training_settings

from models.edge.baselines import baseline_features, boosted_trees
from models.edge.features import STATISTICS, feature_matrix
from models.edge.tokenizer import AGE_EDGES_H
from models.training.evaluate import average_precision

Binner = Callable[[np.ndarray], np.ndarray]


def quantile_binner(train_column: np.ndarray, bins: int) -> Binner:
    """Bin index at ``bins`` quantiles of the column's finite training values; NaN stays NaN."""
    seen = train_column[np.isfinite(train_column)]
    edges = np.unique(np.quantile(seen, np.linspace(0, 1, bins + 1)[1:-1])) if len(seen) else np.zeros(0)
    return lambda x: np.where(np.isfinite(x), np.searchsorted(edges, x, side="right"), np.nan)


def fixed_binner(edges: Sequence[float]) -> Binner:
    cut = np.asarray(edges)
    return lambda x: np.where(np.isfinite(x), np.searchsorted(cut, x, side="right"), np.nan)


def ablate(name: str, datasets_dir: Path, seed: int, age_bins: int) -> list[tuple[str, float]]:
    dataset = next(d for d in DATASETS if d.name == name)
    args = argparse.Namespace(max_minutes=8.0, threads=1, max_steps=None, smoke=False, set={})
    settings = training_settings(dataset, seed, args)
    with tempfile.TemporaryDirectory(prefix="ablation-") as work:
        prepared = prepare(dataset, datasets_dir, Path(work), settings)
    tokenizer = settings.tokenizer
    spec = baseline_features([w.window for w in prepared.train], tokenizer.model_dump(mode="json"))
    names = spec.names()
    x_train = feature_matrix([w.window for w in prepared.train], spec)
    x_test = feature_matrix([w.window for w in prepared.test], spec)
    y_train = np.array([w.failed for w in prepared.train], dtype=np.int64)
    y_test = np.array([w.failed for w in prepared.test], dtype=bool)

    def score(columns: Sequence[int], binned: dict[int, Binner] | None = None) -> float:
        train, test = x_train[:, columns], x_test[:, columns]
        if binned:
            train, test = train.copy(), test.copy()
            for j, c in enumerate(columns):
                if c in binned:
                    train[:, j], test[:, j] = binned[c](train[:, j]), binned[c](test[:, j])
        keep = np.flatnonzero(np.isfinite(train).any(axis=0))
        if not len(keep):
            return float("nan")  # nothing in the group is ever defined on this fleet (no maintenance, no attributes)
        model = boosted_trees(seed=seed)
        model.fit(train[:, keep], y_train)
        return average_precision(y_test.tolist(), model.predict_proba(test[:, keep])[:, 1].tolist()) or 0.0

    def where(test: Callable[[str], bool]) -> list[int]:
        return [i for i, n in enumerate(names) if test(n)]

    every = list(range(len(names)))
    groups = {
        "ages": where(lambda n: n.endswith(":hours")),
        "error counts": where(lambda n: n.startswith("error")),
        "attributes": where(lambda n: n.startswith("attr:")),
        "per-block statistics": where(lambda n: ":b" in n),
        "whole-window statistics": where(lambda n: ":w" in n),
    }
    block = [f":b{b}{stat}" for b in range(spec.blocks) for stat in tokenizer.block_stats]
    lm_visible = where(
        lambda n: (
            not (":b" in n or ":w" in n)
            or any(n.endswith(s) for s in block)
            or any(n.endswith(f":w{stat}") for stat in tokenizer.window_stats)
        )
    )
    statistics = groups["per-block statistics"] + groups["whole-window statistics"]
    as_tokens = {c: quantile_binner(x_train[:, c], tokenizer.bins) for c in statistics}
    ages_fixed = dict.fromkeys(groups["ages"], fixed_binner(AGE_EDGES_H))
    ages_fitted = {c: quantile_binner(x_train[:, c], age_bins) for c in groups["ages"]}

    rows = [("every feature (the baseline)", score(every))]
    for group, columns in groups.items():
        if columns:
            rows.append((f"without {group}", score([c for c in every if c not in columns])))
            rows.append((f"{group} alone", score(columns)))
    if groups["ages"]:
        rows.append(("ages in the LM's fixed age bins", score(every, ages_fixed)))
        rows.append((f"ages in {age_bins} training quantiles", score(every, ages_fitted)))
    rows.append(("what the LM's tokens carry, unquantized", score(lm_visible)))
    rows.append(
        (f"what the LM's tokens carry, in {tokenizer.bins} quantile bins", score(lm_visible, as_tokens | ages_fixed))
    )
    for stat in STATISTICS:
        if stat not in tokenizer.window_stats:
            extra = where(lambda n, stat=stat: n.endswith(f":w{stat}"))
            rows.append((f"LM's, unquantized, + window {stat}", score(sorted({*lm_visible, *extra}))))
    for stat in ("mean", "std", "slope"):
        if stat not in tokenizer.block_stats:
            extra = where(lambda n, stat=stat: any(n.endswith(f":b{b}{stat}") for b in range(spec.blocks)))
            rows.append((f"LM's, unquantized, + block {stat}", score(sorted({*lm_visible, *extra}))))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS, help="folder holding the datasets")
    parser.add_argument("--only", default=",".join(d.name for d in DATASETS), help="comma-separated dataset names")
    parser.add_argument("--seed", type=int, default=0, help="the trees' seed (and the simulated fleets' split)")
    parser.add_argument("--age-bins", type=int, default=16)
    args = parser.parse_args(argv)
    for name in args.only.split(","):
        started = time.monotonic()
        rows = ablate(name.strip(), args.datasets, args.seed, args.age_bins)
        print(f"\n{name} ({time.monotonic() - started:.0f} s): test PR-AUC of gradient boosting")
        full = rows[0][1]
        for label, value in rows:
            print(f"  {label:<58}{value:>7.3f}{value - full:>+8.3f}")


if __name__ == "__main__":
    main()
