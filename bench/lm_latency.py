"""Latency, throughput, size, memory and arithmetic rate of the telemetry LM: torch fp32 vs ONNX fp32 vs ONNX int8.

Everything runs on one core (one intra-op thread), side by side in one run, so the figures compare like with like:

- latency per window (p50, p99), one window at a time, for context lengths 64, 128 and 256;
- batched throughput (windows/s) with batches of ``--batch`` windows of the same length;
- the artifact's size on disk;
- the resident memory of an edge process (a fresh interpreter that imports only :mod:`models.edge.runtime`, loads the
  artifact and scores a batch);
- the arithmetic rate reached (FLOP/s, counted from the architecture) as a share of what one core does on a plain
  large fp32 matrix multiply measured in the same run.

Models: ``--checkpoint DIR`` (repeatable) benchmarks trained checkpoints and prints their validation quality next to
their speed; without it, random-weight models of three sizes (speed does not depend on the weights) are built with the
real tokenizer fitted on synthetic windows.

    .venv/bin/python bench/lm_latency.py                       # stand-in sizes small (the default) / medium / large
    .venv/bin/python bench/lm_latency.py --checkpoint runs/lm  # a trained checkpoint
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from models.edge.runtime import DEFAULT_MAX_BATCH  # noqa: E402
from models.edge.scoring import Window  # noqa: E402
from models.edge.signing import generate_keypair  # noqa: E402
from models.edge.tokenizer import TelemetryTokenizer, TokenizerSettings  # noqa: E402
from models.training.export import (  # noqa: E402
    FP32_MODEL_FILE,
    MODEL_FILE,
    VALUES_INPUT,
    LastTokenLogits,
    export_artifact,
    load_checkpoint_model,
)
from models.training.model import (  # noqa: E402
    CheckpointMeta,
    ModelConfig,
    build_model,
    ensemble_members,
    save_checkpoint,
    takes_values,
)
from models.training.train import TrainSettings  # noqa: E402

SIZES = {
    # the default, read from ModelConfig and TrainSettings so this stand-in cannot drift from it; beside it, the same
    # without the value channel
    "small": {
        "n_embd": ModelConfig.n_embd,
        "n_layer": ModelConfig.n_layer,
        "n_head": ModelConfig.n_head,
        "value_channel": TrainSettings.model_fields["value_channel"].default,
    },
    "small-no-values": {"n_embd": ModelConfig.n_embd, "n_layer": ModelConfig.n_layer, "n_head": ModelConfig.n_head},
    "medium": {"n_embd": 96, "n_layer": 3, "n_head": 4},
    "large": {"n_embd": 128, "n_layer": 4, "n_head": 4},
}
TARGETS = {"p50_ms_at_128": 5.0, "windows_per_s": 1000.0, "speedup_vs_torch": 2.0, "artifact_mb": 5.0, "rss_mb": 250.0}


@dataclass(frozen=True)
class Shape:
    vocab: int
    n_embd: int
    n_layer: int
    n_inner: int

    def flops_per_window(self, length: int) -> float:
        """Multiply-adds x 2 of one window: projections and MLP per token, attention over the whole window, one head.

        Attention counts the full T x T score matrix, which is what the kernels compute (masked or not).
        """
        c, t = self.n_embd, length
        per_layer = 2 * t * (4 * c * c + 2 * c * self.n_inner) + 2 * 2 * t * t * c
        return self.n_layer * per_layer + 2 * c * self.vocab


def one_core_matmul_flops(n: int = 1024, repeats: int = 10) -> float:
    """FLOP/s of one core on a plain fp32 n x n matrix multiply (the best of ``repeats``, in CPU time)."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed_both(lambda: torch.mm(a, b))[1] for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _timed_both(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds: on a shared machine the CPU time is what one core really needed."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def latency_ms(run: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """(wall p50, wall p99, CPU p50) in milliseconds, one window per call."""
    for _ in range(5):
        run()
    samples = np.array([_timed_both(run) for _ in range(repeats)]) * 1e3
    return (
        float(np.percentile(samples[:, 0], 50)),
        float(np.percentile(samples[:, 0], 99)),
        float(np.percentile(samples[:, 1], 50)),
    )


def throughput(run: Callable[[], object], batch: int, min_seconds: float = 1.0) -> tuple[float, float]:
    """(windows per wall second, windows per CPU second)."""
    run()
    count, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < min_seconds or count < 3:
        run()
        count += 1
    return count * batch / (time.perf_counter() - wall), count * batch / (time.process_time() - cpu)


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def synthetic_windows(count: int, sensors: int = 14, seed: int = 0) -> list[Window]:
    """Windows shaped like C-MAPSS engines: 14 drifting sensors, 30 hourly readings."""
    rng = np.random.default_rng(seed)
    names = tuple(f"s{j}" for j in range(sensors))
    out = []
    for i in range(count):
        end = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=int(rng.integers(0, 5000)))
        t = np.array([int((end - timedelta(hours=30 - k)).timestamp()) for k in range(30)], dtype=np.int64)
        values = rng.normal(0, 1, (30, sensors)) + rng.normal(0, 1) * np.linspace(0, 1, 30)[:, None]
        out.append(Window(f"engine-{i % 50}", end - timedelta(hours=30), end, t, names, values.astype(np.float32)))
    return out


def standin_checkpoint(directory: Path, size: str, tokenizer: TelemetryTokenizer) -> Path:
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_positions=256, dropout=0.0, **SIZES[size])
    torch.manual_seed(0)
    model = build_model(config).eval()
    meta = CheckpointMeta(
        model_name=f"standin-{size}",
        parameters=sum(p.numel() for p in model.parameters()),
        horizon_h=30.0,
        threshold=0.5,
        window={"window_h": 30.0, "every_h": 1.0, "min_points": 3, "event_lookback_h": 102.0},
        tokenizer_hash=tokenizer.content_hash,
        context_length=256,
        outcome_tokens=tokenizer.outcome_tokens,
    )
    return save_checkpoint(directory, model, tokenizer, meta)


EDGE_RSS_SCRIPT = """
import json, sys
import numpy as np
from models.edge.runtime import LMScorer
from models.edge.signing import load_public_keys
args = json.loads(sys.argv[1])
scorer = LMScorer.load(args["artifact"], load_public_keys(args["keys"]))
ids = [[(7 * i + k) % args["vocab"] for k in range(args["length"])] for i in range(args["batch"])]
values = [np.linspace(-2, 2, args["length"], dtype=np.float32) for _ in ids] if scorer.takes_values else None
scorer.score_token_ids(ids, values)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"rss_kb": int(status["VmRSS"].split()[0]), "hwm_kb": int(status["VmHWM"].split()[0]),
                  "torch": "torch" in sys.modules}))
"""


def edge_rss_mb(artifact: Path, keys: Path, vocab: int, length: int, batch: int) -> tuple[float, float]:
    args = {"artifact": str(artifact), "keys": str(keys), "vocab": vocab, "length": length, "batch": batch}
    done = subprocess.run(
        [sys.executable, "-c", EDGE_RSS_SCRIPT, json.dumps(args)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["torch"]:
        raise RuntimeError("the edge process imported torch")
    return report["rss_kb"] / 1024, report["hwm_kb"] / 1024


def quality(checkpoint: Path) -> str:
    meta = json.loads((checkpoint / "precursor.json").read_text())
    validation = meta.get("validation") or meta.get("metrics", {}).get("validation", {})
    if "pr_auc" not in validation:
        return "n/a (random weights)"
    return f"PR-AUC {validation['pr_auc']:.3f}, F1 {validation.get('f1', float('nan')):.3f} (validation)"


def torch_run(wrapper: torch.nn.Module, ids: np.ndarray, values: np.ndarray | None) -> Callable[[], object]:
    input_ids = torch.from_numpy(ids)
    last_index = torch.full((len(ids),), ids.shape[1] - 1, dtype=torch.int64)
    given = None if values is None else torch.from_numpy(values)
    return lambda: wrapper(input_ids, last_index, given)


def onnx_run(s: ort.InferenceSession, ids: np.ndarray, values: np.ndarray | None) -> Callable[[], object]:
    feeds = {"input_ids": ids, "last_index": np.full(len(ids), ids.shape[1] - 1, dtype=np.int64)}
    if values is not None:
        feeds[VALUES_INPUT] = values
    return lambda: s.run(None, feeds)


def bench_model(
    name: str, checkpoint: Path, work: Path, keys: Path, lengths: list[int], batch: int, repeats: int, peak: float
) -> list[dict[str, Any]]:
    artifact = export_artifact(
        checkpoint, work / f"{name}-artifact", "0.0.0", keys / "precursor.key", include_fp32=True
    )
    model = load_checkpoint_model(checkpoint)
    cfg = model.config
    shape = Shape(cfg.vocab_size, cfg.n_embd, cfg.n_layer, cfg.n_inner or 4 * cfg.n_embd)
    members = len(ensemble_members(model))  # an ensemble runs each member's arithmetic
    wrapper = LastTokenLogits(model).eval()
    sessions = {"onnx fp32": session(artifact / FP32_MODEL_FILE), "onnx int8": session(artifact / MODEL_FILE)}
    artifact_mb = sum(p.stat().st_size for p in artifact.iterdir() if p.name != FP32_MODEL_FILE) / 1e6
    rss, hwm = edge_rss_mb(artifact, keys, cfg.vocab_size, 128, batch)
    rows = []
    rng = np.random.default_rng(0)
    for length in lengths:
        single = rng.integers(0, cfg.vocab_size, (1, length), dtype=np.int64)
        many = rng.integers(0, cfg.vocab_size, (batch, length), dtype=np.int64)
        # A model with a value channel reads a value beside every id: the same sizes, so the same work per window.
        one_v, many_v = (
            (rng.normal(0, 2, single.shape).astype(np.float32), rng.normal(0, 2, many.shape).astype(np.float32))
            if takes_values(model)
            else (None, None)
        )
        engines = {"torch fp32": (torch_run(wrapper, single, one_v), torch_run(wrapper, many, many_v))}
        for engine, s in sessions.items():
            engines[engine] = (onnx_run(s, single, one_v), onnx_run(s, many, many_v))
        for engine, (one, batched) in engines.items():
            with torch.inference_mode():
                p50, p99, cpu_p50 = latency_ms(one, repeats)
                rate, cpu_rate = throughput(batched, batch)
            rows.append(
                {
                    "model": name,
                    "params": sum(p.numel() for p in model.parameters()),
                    "length": length,
                    "engine": engine,
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "cpu_p50_ms": cpu_p50,
                    "windows_per_s": rate,
                    "cpu_windows_per_s": cpu_rate,
                    "flops_share": cpu_rate * members * shape.flops_per_window(length) / peak,
                    "artifact_mb": artifact_mb,
                    "rss_mb": rss,
                    "hwm_mb": hwm,
                    "quality": quality(checkpoint),
                }
            )
    return rows


def print_table(rows: list[dict[str, Any]], peak: float, batch: int) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\none core: fp32 matmul 1024x1024 (torch) {peak / 1e9:.1f} GFLOP/s; batches of {batch}; load average {load}"
    )
    print("wall = elapsed time; cpu = CPU time of this process (what one core needed, whatever else the host ran)\n")
    header = (
        f"{'model':<16}{'params':>9}{'len':>5}  {'engine':<11}{'p50 ms':>8}{'p99 ms':>8}{'cpu p50':>8}"
        f"{'win/s':>8}{'cpu win/s':>10}{'% peak':>8}{'x torch':>8}"
    )
    print(header)
    print("-" * len(header))
    torch_cpu = {(r["model"], r["length"]): r["cpu_p50_ms"] for r in rows if r["engine"] == "torch fp32"}
    for r in rows:
        speedup = torch_cpu[(r["model"], r["length"])] / r["cpu_p50_ms"]
        print(
            f"{r['model']:<16}{r['params']:>9,}{r['length']:>5}  {r['engine']:<11}{r['p50_ms']:>8.2f}"
            f"{r['p99_ms']:>8.2f}{r['cpu_p50_ms']:>8.2f}{r['windows_per_s']:>8.0f}{r['cpu_windows_per_s']:>10.0f}"
            f"{100 * r['flops_share']:>7.1f}%{speedup:>8.1f}"
        )
    print()
    print(f"{'model':<16}{'artifact MB':>12}{'edge RSS MB':>12}{'edge peak MB':>13}  quality")
    for model in dict.fromkeys(r["model"] for r in rows):
        r = next(r for r in rows if r["model"] == model)
        print(f"{model:<16}{r['artifact_mb']:>12.2f}{r['rss_mb']:>12.0f}{r['hwm_mb']:>13.0f}  {r['quality']}")
    print(
        "\ntargets at 128 tokens (default model), on CPU time: int8 p50 <= 5 ms, >= 1000 windows/s batched, int8 >= 2x "
        "torch fp32, artifact <= 5 MB, edge RSS <= 250 MB"
    )
    for model in dict.fromkeys(r["model"] for r in rows):
        at128 = {r["engine"]: r for r in rows if r["model"] == model and r["length"] == 128}
        if "onnx int8" not in at128:
            continue
        int8, reference = at128["onnx int8"], at128["torch fp32"]
        checks = {
            "p50": int8["cpu_p50_ms"] <= TARGETS["p50_ms_at_128"],
            "throughput": int8["cpu_windows_per_s"] >= TARGETS["windows_per_s"],
            "vs torch": reference["cpu_p50_ms"] / int8["cpu_p50_ms"] >= TARGETS["speedup_vs_torch"],
            "size": int8["artifact_mb"] <= TARGETS["artifact_mb"],
            "RSS": int8["rss_mb"] <= TARGETS["rss_mb"],
        }
        print(f"  {model}: " + "; ".join(f"{k} {'PASS' if ok else 'MISS'}" for k, ok in checks.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, action="append", default=[], help="trained checkpoint folder")
    parser.add_argument(
        "--sizes",
        default=None,
        help="stand-in sizes, comma-separated (default: small,medium,large without --checkpoint)",
    )
    parser.add_argument("--lengths", default="64,128,256")
    parser.add_argument(
        "--batch", type=int, default=DEFAULT_MAX_BATCH, help="windows per batch (default: the runtime's largest batch)"
    )
    parser.add_argument("--repeats", type=int, default=200, help="single-window runs per latency figure")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    lengths = [int(x) for x in args.lengths.split(",")]
    peak = one_core_matmul_flops()

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lm-bench-") as tmp:
        work = Path(tmp)
        keys = work / "keys"
        generate_keypair(keys)
        models = {path.name: path for path in args.checkpoint}
        tokenize_line = ""
        sizes = args.sizes if args.sizes is not None else ("" if models else ",".join(SIZES))
        if sizes:
            tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=30, window_h=30, blocks=3, bins=16))
            tokenizer.fit(synthetic_windows(300), ["failure"])
            sample = synthetic_windows(200, seed=1)
            stream = itertools.cycle(sample)
            p50, p99, cpu = latency_ms(lambda: tokenizer.encode(next(stream)), 200)
            tokenize_line = (
                f"tokenize one window (14 sensors x 30 readings, {len(tokenizer.encode(sample[0]))} tokens): "
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, cpu p50 {cpu:.2f} ms"
            )
            for size in sizes.split(","):
                models[f"standin-{size}"] = standin_checkpoint(work / size, size, tokenizer)
        for name, checkpoint in models.items():
            rows += bench_model(name, checkpoint, work, keys, lengths, args.batch, args.repeats, peak)
    print_table(rows, peak, args.batch)
    if tokenize_line:
        print(tokenize_line)
    if args.json:
        args.json.write_text(json.dumps({"peak_flops": peak, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
