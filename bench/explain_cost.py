"""What explaining alerts costs the edge: time per explained window, and per 1,000 predictions at an alert rate.

The edge explains only the windows at or above the alert threshold (:mod:`models.edge.explain`), in the batch it scored
them in. This bench does what the edge does: it trains the default telemetry LM on a simulated fleet (all failure
kinds, error codes and maintenance: the simulator's default profile), exports the signed int8 artifact, and replays a
later period of that fleet through the runtime in the edge's batches (``model.max_batch``, 16 windows), on one
ONNX thread: each batch scored, then its alerting windows explained together. It prints the scoring cost, the
explaining cost per explained window (wall and CPU time, and how many variants were scored), and both per 1,000
predictions at the alert rate the model showed and at fixed rates.

    .venv/bin/python bench/explain_cost.py                      # 20 machines, 21 days, 300 training steps
    .venv/bin/python bench/explain_cost.py --artifact DIR --keys DIR --fleet DIR   # an artifact already trained
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

from models.edge.explain import explainer_for  # noqa: E402
from models.edge.runtime import DEFAULT_MAX_BATCH, LMScorer  # noqa: E402
from models.edge.signing import generate_keypair, load_public_keys  # noqa: E402
from models.training.dataset import Fleet, WindowSpec, build_windows, parse_time  # noqa: E402
from models.training.train import TrainSettings, train  # noqa: E402
from precursor.simulator import FleetConfig, simulate_fleet  # noqa: E402
from precursor.simulator.planted import write_fleet_files  # noqa: E402

TEST_DAYS = 5


def build(work: Path, machines: int, days: int, steps: int) -> tuple[Path, Path, dict[str, Path], str]:
    """A simulated fleet's files and the default LM trained on all but its last days, exported and signed."""
    data = simulate_fleet(FleetConfig(machines=machines, duration=f"{days}d", seed=0))
    files = write_fleet_files(data, work / "fleet")
    keys = work / "keys"
    generate_keypair(keys)
    until = data.config.start.timestamp() + (days - TEST_DAYS) * 86400
    until_iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    train(
        files["telemetry"],
        files["events"],
        work / "artifact",
        TrainSettings(horizon_h=24.0, window_h=6.0, max_steps=steps),
        machines=files["machines"],
        signing_key=keys / "precursor.key",
        until=until_iso,
    )
    return work / "artifact", keys, files, until_iso


def measure(scorer: LMScorer, windows: list, batch: int) -> dict[str, float]:
    explainer = explainer_for(scorer)
    assert explainer is not None
    variants = 0
    score = scorer.score_token_ids

    def counted(sequences, values=None, *, batch_size=None):  # type: ignore[no-untyped-def]
        nonlocal variants
        variants += len(sequences)
        return score(sequences, values, batch_size=batch_size)

    score_wall = score_cpu = explain_wall = explain_cpu = 0.0
    explained = reasons = 0
    for start in range(0, len(windows), batch):
        chunk = windows[start : start + batch]
        t0, c0 = time.perf_counter(), time.process_time()
        risks = scorer.score_many(chunk)
        score_wall += time.perf_counter() - t0
        score_cpu += time.process_time() - c0
        picked = [i for i, r in enumerate(risks) if max(r.values()) >= scorer.threshold]
        if not picked:
            continue
        scorer.score_token_ids = counted  # type: ignore[method-assign]
        t0, c0 = time.perf_counter(), time.process_time()
        found = explainer.explain_many([chunk[i] for i in picked], [risks[i] for i in picked])
        explain_wall += time.perf_counter() - t0
        explain_cpu += time.process_time() - c0
        scorer.score_token_ids = score  # type: ignore[method-assign]
        explained += len(picked)
        reasons += sum(len(f) for f in found)
    n = len(windows)
    return {
        "windows": n,
        "explained": explained,
        "alert_rate": explained / n,
        "score_ms_per_window": 1e3 * score_wall / n,
        "score_cpu_ms_per_window": 1e3 * score_cpu / n,
        "explain_ms_per_window": 1e3 * explain_wall / max(1, explained),
        "explain_cpu_ms_per_window": 1e3 * explain_cpu / max(1, explained),
        "variants_per_window": variants / max(1, explained),
        "reasons_per_window": reasons / max(1, explained),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machines", type=int, default=20)
    parser.add_argument("--days", type=int, default=21)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--artifact", type=Path, help="a signed artifact already trained (with --keys and --fleet)")
    parser.add_argument("--keys", type=Path)
    parser.add_argument("--fleet", type=Path, help="folder of telemetry.csv, events.csv, machines.csv")
    parser.add_argument("--since", help="replay windows ending from this time (with --artifact)")
    parser.add_argument("--batch", type=int, default=DEFAULT_MAX_BATCH, help="windows scored together, as the edge")
    parser.add_argument("--work", type=Path, help="build the fleet and artifact here and keep them (to run again)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="explain-cost-") as tmp:
        if args.artifact is None:
            artifact, keys, files, since = build(args.work or Path(tmp), args.machines, args.days, args.max_steps)
            if args.work is not None:
                again = f"--artifact {artifact} --keys {keys} --fleet {files['telemetry'].parent} --since {since}"
                print(f"kept in {args.work}: {again}")
        else:
            if args.keys is None or args.fleet is None or args.since is None:
                parser.error("--artifact needs --keys, --fleet and --since")
            artifact, keys, since = args.artifact, args.keys, args.since
            files = {name: args.fleet / f"{name}.csv" for name in ("telemetry", "events", "machines")}
        scorer = LMScorer.load(artifact, load_public_keys(keys), intra_op_num_threads=1)
        window = json.loads((artifact / "precursor.json").read_text())["window"]  # the rule it was trained on
        fleet = Fleet.load(files["telemetry"], files["events"], files["machines"])
        spec = WindowSpec(horizon_h=scorer.horizon_h, **window)
        windows = [w.window for w in build_windows(fleet, spec, ends_from_s=parse_time(since))]
        windows.sort(key=lambda w: (w.end, w.machine_id))  # as they complete at an edge: all machines, hour by hour
        scorer.score_many(windows[: args.batch])  # warm
        figures = measure(scorer, windows, args.batch)
    figures["tokens_per_window"] = float(np.mean([len(scorer.tokenizer.encode(w)) for w in windows[:200]]))  # type: ignore[attr-defined]
    figures["sensors"] = len(scorer.tokenizer.sensors)  # type: ignore[attr-defined]
    print(
        f"{figures['windows']} windows of {figures['sensors']} sensors ({figures['tokens_per_window']:.0f} tokens), "
        f"batches of {args.batch}, one ONNX thread"
    )
    print(
        f"scoring: {figures['score_ms_per_window']:.3f} ms a window wall, {figures['score_cpu_ms_per_window']:.3f} ms "
        f"CPU; per 1,000 predictions {figures['score_ms_per_window']:.2f} s wall"
    )
    print(
        f"explaining: {figures['explained']} windows at or above the threshold ({figures['alert_rate']:.1%}); per "
        f"explained window {figures['explain_ms_per_window']:.2f} ms wall, {figures['explain_cpu_ms_per_window']:.2f} "
        f"ms CPU, {figures['variants_per_window']:.1f} sequences scored, {figures['reasons_per_window']:.2f} reasons"
    )
    rates = [figures["alert_rate"], 0.01, 0.05, 0.10]
    print("per 1,000 predictions: scoring + explaining (CPU seconds), and the share explaining adds")
    for rate in rates:
        score_s = figures["score_cpu_ms_per_window"]
        explain_s = rate * figures["explain_cpu_ms_per_window"]
        label = "observed" if rate is rates[0] else "fixed"
        print(
            f"  alert rate {rate:5.1%} ({label}): {score_s:.2f} s + {explain_s:.2f} s = {score_s + explain_s:.2f} s "
            f"(+{explain_s / score_s:.0%})"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
