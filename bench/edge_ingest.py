"""Sustained edge ingest on one core, with the int8 telemetry LM scoring every window.

The fleet: ``--machines`` machines with ``--sensors`` sensors each, one reading per machine every ``--interval``
seconds of telemetry time, one window per machine per minute of telemetry time (``--window 1m``), replayed from a
CSV file as fast as it goes. The agent is the real daemon (reader thread, window builder, LM scoring in batches,
the SQLite outbox with its window journal and positions, heartbeats), pinned to one CPU with one ONNX Runtime thread,
with its Kafka sender off: the figures stop at the outbox. The LM artifact is exported in a separate process first, so
the measured process never imports torch (its resident memory is the edge's).

Prints: readings/s and windows/s over the whole replay; the latency from a reading's arrival (the moment its source
read it) to its prediction being committed to the outbox (p50, p99, over every window); peak resident memory.

The agent explains its alerting windows (``models.edge.explain``), and an explained window costs about 24 scored
ones. The stand-in LM is untrained, so at its own threshold nearly every window would alert; the bench explains the
share ``--alert-rate`` (1 % by default, a fleet's usual rate or more) instead: the threshold is the stand-in's risk
quantile over a first, unmeasured replay of the same telemetry with explanations off.

    .venv/bin/python bench/edge_ingest.py                        # 1,000 machines x 10 sensors, 1 s readings, 5 min
    .venv/bin/python bench/edge_ingest.py --model drift-zscore   # the baseline instead of the LM
    .venv/bin/python bench/edge_ingest.py --n-embd 96 --n-layer 3 --n-head 4   # a larger LM
    .venv/bin/python bench/edge_ingest.py --summaries            # telemetry summaries on (one per window period)
    .venv/bin/python bench/edge_ingest.py --block-stats mean,slope   # the longer windows training's search may keep

The LM is the one training makes by default: its size and value channel are read from
:class:`models.training.train.TrainSettings`, so this stand-in cannot drift from it.
"""

from __future__ import annotations

import os

# One core means one thread everywhere, set before numpy or ONNX Runtime load their thread pools.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_throughput import cpu_name  # noqa: E402

START = 1_767_225_600  # 2026-01-01T00:00:00Z


def sensor_names(count: int) -> list[str]:
    return [f"s{j:02d}" for j in range(count)]


def write_telemetry(path: Path, machines: int, sensors: int, interval_s: int, minutes: int, seed: int = 0) -> int:
    """The fleet's CSV, rows in time order across machines (as a plant historian exports it); returns the row count."""
    rng = np.random.default_rng(seed)
    names = sensor_names(sensors)
    ids = [f"m-{i:05d}" for i in range(machines)]
    level = rng.normal(50, 10, (machines, sensors))
    rows = 0
    with path.open("w") as fh:
        fh.write(",".join(["timestamp", "machine_id", *names]) + "\n")
        for t in range(START, START + minutes * 60, interval_s):
            stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            noise = rng.normal(0, 1, (machines, sensors)) + level
            fh.write(
                "".join(f"{stamp},{ids[i]}," + ",".join(f"{v:.3f}" for v in noise[i]) + "\n" for i in range(machines))
            )
            rows += machines
    return rows


def build_artifact(
    out: Path,
    sensors: int,
    window_s: int,
    *,
    n_embd: int | None = None,
    n_layer: int | None = None,
    n_head: int | None = None,
    block_stats: tuple[str, ...] | None = None,
    value_channel: bool | None = None,
) -> tuple[Path, Path]:
    """A telemetry LM, int8 ONNX, signed, as training makes it by default unless told otherwise: ``n_embd``,
    ``n_layer``, ``n_head`` and ``value_channel`` (None: :class:`models.training.train.TrainSettings`'s default) and
    the tokenizer's ``block_stats`` (None: :class:`models.edge.tokenizer.TokenizerSettings`'s). Runs in a child
    process."""
    from models.edge.scoring import Window
    from models.edge.signing import generate_keypair
    from models.edge.tokenizer import TelemetryTokenizer, TokenizerSettings
    from models.training.export import export_artifact
    from models.training.model import CheckpointMeta, ModelConfig, build_model, count_parameters, save_checkpoint
    from models.training.train import TrainSettings

    rng = np.random.default_rng(1)
    names = tuple(sensor_names(sensors))
    windows = []
    for m in range(20):
        for k in range(20):
            end = START + (k + 1) * window_s
            stamps = np.arange(end - window_s, end, max(1, window_s // 60), dtype=np.int64)
            values = rng.normal(50 + m, 1 + k / 10, (len(stamps), len(names))).astype(np.float32)
            windows.append(
                Window(
                    f"m-{m:05d}",
                    datetime.fromtimestamp(end - window_s, UTC),
                    datetime.fromtimestamp(end, UTC),
                    stamps,
                    names,
                    values,
                )
            )
    stats = {} if block_stats is None else {"block_stats": block_stats}
    tokenizer = TelemetryTokenizer(
        TokenizerSettings.model_validate({"horizon_h": 24, "window_h": window_s / 3600, "min_machine_rows": 10} | stats)
    )
    tokenizer.fit(windows, ["bearing", "seal"])
    defaults = TrainSettings.model_fields
    size = {
        name: defaults[name].default if value is None else value
        for name, value in (("n_embd", n_embd), ("n_layer", n_layer), ("n_head", n_head))
    }
    values = defaults["value_channel"].default if value_channel is None else value_channel
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, n_positions=tokenizer.settings.max_length, value_channel=values, **size
    )
    model = build_model(config).eval()
    meta = CheckpointMeta(
        parameters=count_parameters(model),
        horizon_h=24,
        threshold=0.5,
        window={"window_h": window_s / 3600, "every_h": window_s / 3600, "min_points": 3, "event_lookback_h": 72},
        tokenizer_hash=tokenizer.content_hash,
    )
    keys = out / "keys"
    pair = generate_keypair(keys, "bench")
    checkpoint = save_checkpoint(out / "checkpoint", model, tokenizer, meta)
    artifact = export_artifact(checkpoint, out / "artifact", "bench-1", pair.private_key_path, windows[:100])
    print(
        f"artifact: {count_parameters(model):,} parameters (n_embd {config.n_embd}, n_layer {config.n_layer}, "
        f"n_head {config.n_head}, value channel {'on' if config.value_channel else 'off'}), "
        f"{len(tokenizer.encode(windows[0]))} tokens per window (block statistics: "
        f"{', '.join(tokenizer.settings.block_stats)})"
    )
    return artifact, pair.public_key_path


@dataclass(frozen=True)
class Figures:
    readings: int
    windows: int
    predictions: int
    seconds: float
    cpu_seconds: float
    p50_ms: float
    p99_ms: float
    peak_rss_mib: float
    quarantined: int
    summaries: int = 0
    explained: int = 0

    def lines(self) -> list[str]:
        return [
            f"ingest:   {self.readings:,} readings in {self.seconds:.2f} s = "
            f"{self.readings / self.seconds:,.0f} readings/s "
            f"(CPU time {self.cpu_seconds:.2f} s: {self.readings / self.cpu_seconds:,.0f} readings per CPU-second)",
            f"windows:  {self.windows:,} completed, {self.predictions:,} scored = "
            f"{self.predictions / self.seconds:,.0f} windows/s",
            f"latency:  reading arrival -> prediction in the outbox: "
            f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms",
            f"memory:   peak resident {self.peak_rss_mib:.0f} MiB",
            f"quarantined: {self.quarantined}",
            f"summaries: {self.summaries:,} telemetry summaries in the outbox",
            f"explained: {self.explained:,} alerting windows ({self.explained / max(1, self.predictions):.1%})",
        ]


def run_agent(
    telemetry: Path,
    state: Path,
    *,
    model: str,
    artifact: Path | None,
    keys: Path | None,
    window: str,
    durability: str,
    batch_rows: int = 32,
    max_batch: int | None = None,
    summaries: bool = False,
    explain_above: float | None = None,
) -> Figures:
    """One replay through the daemon; ``explain_above``: the risk from which windows are explained (None: none)."""
    from edge_agent.config import EdgeConfig
    from edge_agent.daemon import AgentDaemon

    model_spec: dict[str, object] = {"type": model, "threads": 1}
    if max_batch is not None:
        model_spec["max_batch"] = max_batch
    if model == "lm":
        model_spec |= {"artifact": str(artifact), "trusted_keys": [str(keys)]}
    config = EdgeConfig.from_dict(
        {
            "edge_id": "bench",
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "sources": [{"type": "replay", "telemetry": str(telemetry), "batch_rows": batch_rows}],
            "window": {"length": window, "every": window, "min_points": 3},
            "model": model_spec,
            "updates": {"enabled": False},
            "outbox": {"max_bytes": "4GiB", "durability": durability},
            "health": {"enabled": False},
            "heartbeat": {"interval": "30s"},
            "log": {"level": "WARNING"},
            "telemetry_summaries": {"enabled": summaries},
            "explain": {"enabled": explain_above is not None, "threshold": explain_above},
            "state_dir": str(state),
        }
    )
    daemon = AgentDaemon(config, send=False)
    started, cpu_started = time.perf_counter(), time.process_time()
    stats = daemon.run()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    latencies = np.fromiter(daemon.agent.latency.recent, dtype=np.float64) * 1000
    return Figures(
        readings=stats.readings,
        windows=stats.windows,
        predictions=stats.predictions,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        p50_ms=float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        p99_ms=float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        quarantined=stats.quarantined,
        summaries=stats.summaries,
        explained=stats.explained,
    )


def explain_threshold(telemetry: Path, state: Path, rate: float, **agent: Any) -> float | None:
    """The risk at or above which ``rate`` of the replay's windows lie, read from the predictions of a replay of
    ``telemetry`` with explanations off; None for a rate of 0 (explain nothing)."""
    from edge_agent.daemon import OUTBOX_FILE
    from edge_agent.outbox import Outbox
    from precursor.contracts.messages import Prediction, decode

    if rate <= 0:
        return None
    if rate >= 1:
        return 0.0
    run_agent(telemetry, state, explain_above=None, **agent)
    outbox = Outbox(state / OUTBOX_FILE, max_bytes=2**32)
    reader = outbox.reader()
    try:
        rows = reader.pending(outbox.depth)
    finally:
        reader.close()
        outbox.close()
    top = [max(decode(Prediction, row.value).risk.values()) for row in rows if row.kind == "prediction"]
    if not top:
        raise RuntimeError("the calibration replay made no predictions to set the explanation threshold from")
    return float(np.quantile(top, 1 - rate))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--sensors", type=int, default=10)
    parser.add_argument(
        "--interval", type=int, default=1, help="seconds of telemetry time between a machine's readings"
    )
    parser.add_argument("--minutes", type=int, default=5, help="minutes of telemetry time to replay")
    parser.add_argument("--window", default="1m", help="window length and period (one window per machine per this)")
    parser.add_argument("--model", choices=["lm", "drift-zscore"], default="lm")
    parser.add_argument("--artifact", type=Path, help="a signed LM artifact to use instead of exporting one")
    parser.add_argument("--keys", type=Path, help="the public key (or folder) that signed --artifact")
    parser.add_argument("--durability", choices=["process", "power"], default="process")
    parser.add_argument("--batch-rows", type=int, default=32, help="rows the replay reads at a time")
    parser.add_argument("--core", type=int, default=None, help="CPU to pin to (default: the last one allowed)")
    parser.add_argument(
        "--max-batch", type=int, default=None, help="the agent's model.max_batch (default: the config's default)"
    )
    # The exported LM's size; None leaves models.training.model.ModelConfig's default (read in the child: torch stays
    # out of the measured process).
    parser.add_argument("--n-embd", type=int, default=None, help="LM width (default: ModelConfig's, 64)")
    parser.add_argument("--n-layer", type=int, default=None, help="LM layers (default: ModelConfig's, 2)")
    parser.add_argument("--n-head", type=int, default=None, help="LM attention heads (default: ModelConfig's, 2)")
    parser.add_argument(
        "--block-stats",
        default=None,
        help="the tokenizer's statistics per block, comma-separated (default: TokenizerSettings', mean); "
        "mean,slope is what training's default search keeps where validation prefers it",
    )
    parser.add_argument(
        "--no-values", action="store_true", help="the LM without its value channel (on by default, as in training)"
    )
    parser.add_argument("--summaries", action="store_true", help="send telemetry summaries (one per window period)")
    parser.add_argument(
        "--alert-rate",
        type=float,
        default=0.01,
        help="share of windows the agent explains as alerts (default 0.01; 0: none, 1: every window)",
    )
    parser.add_argument("--build-artifact", type=Path, help=argparse.SUPPRESS)  # the child process's job
    args = parser.parse_args(argv)
    from precursor.contracts.durations import parse_duration

    window_s = int(parse_duration(args.window).total_seconds())
    if args.build_artifact:
        build_artifact(
            args.build_artifact,
            args.sensors,
            window_s,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            block_stats=None if args.block_stats is None else tuple(args.block_stats.split(",")),
            value_channel=False if args.no_values else None,
        )
        return

    with tempfile.TemporaryDirectory(prefix="precursor-edge-bench-") as scratch:
        work = Path(scratch)
        artifact, keys = args.artifact, args.keys
        if args.model == "lm" and artifact is None:
            started = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--build-artifact",
                    str(work / "model"),
                    "--sensors",
                    str(args.sensors),
                    "--window",
                    args.window,
                    *(
                        arg
                        for flag, value in (
                            ("--n-embd", args.n_embd),
                            ("--n-layer", args.n_layer),
                            ("--n-head", args.n_head),
                            ("--block-stats", args.block_stats),
                        )
                        if value is not None
                        for arg in (flag, str(value))
                    ),
                    *(["--no-values"] if args.no_values else []),
                ],
                check=True,
            )
            artifact, keys = work / "model" / "artifact", work / "model" / "keys" / "bench.pub"
            print(f"artifact: exported in {time.perf_counter() - started:.1f} s (not measured)")
        telemetry = work / "telemetry.csv"
        rows = write_telemetry(telemetry, args.machines, args.sensors, args.interval, args.minutes)

        allowed = sorted(os.sched_getaffinity(0))
        core = args.core if args.core is not None else allowed[-1]
        os.sched_setaffinity(0, {core})
        print(f"date:     {datetime.now(UTC).isoformat(timespec='seconds')}")
        print(
            f"machine:  {cpu_name()}, {os.cpu_count()} cores; pinned to CPU {core}; Python {platform.python_version()}"
        )
        print(
            f"fleet:    {args.machines} machines x {args.sensors} sensors, a reading every {args.interval} s, "
            f"windows of {args.window} every {args.window}, {args.minutes} min of telemetry = {rows:,} readings "
            f"({telemetry.stat().st_size / 2**20:.0f} MiB CSV)"
        )
        batch = f"max_batch {args.max_batch}" if args.max_batch is not None else "max_batch default"
        summaries = "telemetry summaries on" if args.summaries else "telemetry summaries off"
        print(f"model:    {args.model}; {batch}; outbox durability {args.durability}; {summaries}")
        agent: dict[str, Any] = {
            "model": args.model,
            "artifact": artifact,
            "keys": keys,
            "window": args.window,
            "durability": args.durability,
            "batch_rows": args.batch_rows,
            "max_batch": args.max_batch,
            "summaries": args.summaries,
        }
        explain_above = None
        if args.model == "lm":  # the baseline cannot be explained
            explain_above = explain_threshold(telemetry, work / "calibration", args.alert_rate, **agent)
            shown = "off" if explain_above is None else f"windows at risk >= {explain_above:.4f}"
            print(f"explain:  {shown} (--alert-rate {args.alert_rate:g}, set on an unmeasured replay)")
        figures = run_agent(telemetry, work / "state", explain_above=explain_above, **agent)
        for line in figures.lines():
            print(line)


if __name__ == "__main__":
    main()
