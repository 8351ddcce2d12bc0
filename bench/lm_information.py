"""How much of what predicts a failure reaches the LM's tokens: gradient boosting on what each side sees.

The same gradient-boosting classifier as the baseline, fitted on the same training windows and scored on the same
test windows (the split ``precursor train`` and ``precursor evaluate`` use), side by side in one run, on:

1. the LM's token ids, one column per position (bins are ordered within a sensor's statistic, so trees can split on
   them): what the tokenizer keeps, quantization included;
2. the statistics the tokenizer bins, as continuous values, plus the context features: the same information before
   quantization;
3. every statistic and context feature (the baseline itself).

If (1) or (2) falls well below (3), the tokenizer's choice of statistics, not the model, limits the LM. Prints the
validation and test PR-AUC of each.

    .venv/bin/python bench/lm_information.py --data runs/sim --horizon 24 --until 2026-03-02T00:00:00Z \
        --daily-profile --block-stats mean --window-stats slope,std
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from models.edge.baselines import baseline_features, boosted_trees  # noqa: E402
from models.edge.features import feature_matrix  # noqa: E402
from models.edge.tokenizer import TelemetryTokenizer  # noqa: E402
from models.training.dataset import Fleet, build_windows, choose_split, parse_time, split_windows  # noqa: E402
from models.training.evaluate import average_precision  # noqa: E402
from models.training.train import TrainSettings  # noqa: E402

FD001 = REPO_ROOT.parent / "shared" / "datasets" / "cmapss_fd001" / "train"


def token_columns(tokenizer: TelemetryTokenizer, windows: list, width: int | None = None) -> np.ndarray:
    """Token ids by position, right-padded with -1 (the trees' "nothing here")."""
    ids = tokenizer.encode_many([w.window for w in windows])
    width = width or max(len(s) for s in ids)
    out = np.full((len(ids), width), -1.0)
    for i, sequence in enumerate(ids):
        out[i, : min(len(sequence), width)] = sequence[:width]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=FD001, help="folder with telemetry.csv, events.csv, machines.csv")
    parser.add_argument("--horizon", type=float, default=30.0, help="hours")
    parser.add_argument("--until", default=None, help="training data ends here; the test windows start here")
    parser.add_argument("--scaling", default="machine")
    parser.add_argument("--daily-profile", action="store_true")
    parser.add_argument("--residual", action="store_true")
    parser.add_argument("--block-stats", default="mean")
    parser.add_argument("--window-stats", default="slope,std")
    args = parser.parse_args(argv)

    def names(value: str) -> tuple[str, ...]:
        return tuple(s for s in value.split(",") if s)

    settings = TrainSettings(
        horizon_h=args.horizon,
        window_h=args.horizon,
        scaling=args.scaling,
        daily_profile=args.daily_profile,
        residual=args.residual,
        block_stats=names(args.block_stats),
        window_stats=names(args.window_stats),
    )
    started = time.monotonic()
    d = args.data
    fleet = Fleet.load(d / "telemetry.csv", d / "events.csv", d / "machines.csv")
    until_s = parse_time(args.until) if args.until else None
    split = choose_split(fleet, settings.horizon_h, until_s=until_s, fraction=settings.validation_fraction)
    train, validation = split_windows(fleet, settings.window_spec(), split)
    test = build_windows(fleet, settings.window_spec(), ends_from_s=split.until_s)
    if not test:
        sys.exit("no test windows: give --until inside the data")
    print(f"windows: training {len(train)}, validation {len(validation)}, test {len(test)}", flush=True)

    labels = [np.array([w.failed for w in ws]) for ws in (train, validation, test)]

    def fit_and_score(name: str, columns: list[np.ndarray]) -> None:
        model = boosted_trees()
        model.fit(columns[0], labels[0])
        pr = [average_precision(y, model.predict_proba(x)[:, 1]) for x, y in zip(columns[1:], labels[1:], strict=True)]
        print(f"{name:58s} {columns[0].shape[1]:4d} columns  validation {pr[0]:.3f}  test {pr[1]:.3f}", flush=True)

    tokenizer = TelemetryTokenizer(settings.tokenizer)
    tokenizer.fit([w.window for w in train], outcomes=[w.outcome for w in train])
    tokens = [token_columns(tokenizer, train)]
    tokens += [token_columns(tokenizer, ws, tokens[0].shape[1]) for ws in (validation, test)]
    fit_and_score("1. the LM's tokens", tokens)

    spec = baseline_features([w.window for w in train], settings.tokenizer.model_dump())
    feature_names = spec.names()
    sensor_stat = {
        f"{s}:b{b}{stat}"
        for stat in settings.tokenizer.block_stats
        for b in range(settings.tokenizer.blocks)
        for s in spec.scaling.sensors
    }
    sensor_stat |= {f"{s}:w{stat}" for stat in settings.tokenizer.window_stats for s in spec.scaling.sensors}
    is_sensor = [":w" in n or ":b" in n for n in feature_names]
    keep = [i for i, n in enumerate(feature_names) if n in sensor_stat or not is_sensor[i]]
    features = [feature_matrix([w.window for w in ws], spec) for ws in (train, validation, test)]
    fit_and_score("2. the LM's statistics, continuous, and the context", [f[:, keep] for f in features])
    fit_and_score("3. every statistic and the context (the baseline)", features)
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
