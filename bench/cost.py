"""What a prediction costs, edge against cloud, in one run: CPU seconds and energy per 1,000 predictions.

1. cloud, retraining: a simulated history (``--machines`` machines over ``--history-days``) trains the telemetry LM
   (``--max-steps`` steps, one thread), which is exported to int8 ONNX and signed. Per 1,000 training windows.
2. edge, scoring: a simulated live fleet is replayed through the real edge agent daemon (Kafka sender off: the
   figures stop at the outbox), once with that LM and once with the drift z-score baseline, one scoring thread.
   "edge scoring" counts the CPU spent inside the scorer (the agent's flow meter); "edge agent" the whole process
   (parsing, windows, scoring, outbox) while it ran.
3. cloud, ingest: ``--messages`` predictions (and failure events) in Kafka, one bounded ingest run of the local
   Beam runner into a fresh store: its CPU as the pipeline records it (``pipeline_runs``), per 1,000 predictions.
   Uses the configured broker if it answers, else a temporary local one.

Energy: RAPL package counters where this machine lets them be read (the whole package while the part ran: an upper
bound), else ``CPU seconds x PRECURSOR_ENERGY_WATTS_PER_CORE`` (``--watts-per-core``), named beside each figure.

    .venv/bin/python bench/cost.py                    # about 3 minutes on 2 cores
    .venv/bin/python bench/cost.py --max-steps 400 --messages 50000
"""

from __future__ import annotations

import os

# One thread everywhere, set before numpy, torch or ONNX Runtime start their pools: CPU per prediction on one core.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka import KafkaProducer  # noqa: E402
from kafka_throughput import cpu_name, own_topics, predictions  # noqa: E402
from pipeline_throughput import failure_events  # noqa: E402

from infra.energy import Cost, CostMeter, EnergySettings, cores, estimate  # noqa: E402
from precursor.demo import DEMO_TRAINING, EVERY_H, HORIZON_H, WINDOW_H  # noqa: E402
from precursor.simulator import FleetConfig, write_fleet  # noqa: E402


@dataclass(frozen=True)
class Row:
    part: str
    where: str
    cost: Cost
    per: str = "predictions"
    note: str = ""


def retrain(home: Path, machines: int, days: float, max_steps: int, energy: EnergySettings) -> tuple[Row, Path, Path]:
    """Train, export and sign the LM on a simulated history; its cost per 1,000 training windows."""
    from transformers.utils import logging as transformers_logging

    from models.edge.signing import generate_keypair
    from models.training.train import train

    history = write_fleet(
        FleetConfig(machines=machines, duration=f"{days}d", interval="10m", seed=11), home / "history"
    )
    # The demo's recipe (windows, horizon, fleet scaling, one thread), trained for the steps asked for here.
    settings = DEMO_TRAINING.model_copy(
        update={"max_steps": max_steps, "eval_every": max(1, max_steps // 4), "max_minutes": 60.0}
    )
    keys = generate_keypair(home / "keys", "bench")
    transformers_logging.disable_progress_bar()
    logging.disable(logging.WARNING)
    try:
        with CostMeter(energy) as meter:
            result = train(
                history.telemetry,
                history.events,
                home / "model",
                settings,
                machines=history.machines,
                signing_key=keys.private_key_path,
                checkpoint_dir=home / "checkpoint",
                version="bench-1",
            )
    finally:
        logging.disable(logging.NOTSET)
    windows = int(sum(result.meta.data["training_windows"].values()))
    assert result.artifact_dir is not None
    note = f"{result.meta.parameters:,} parameters, {max_steps} steps, {meter.wall_s:.0f} s wall"
    return (
        Row("retraining", "cloud", meter.cost(windows), "training windows", note),
        result.artifact_dir,
        keys.public_key_path,
    )


def edge(home: Path, machines: int, days: float, model: dict[str, object], energy: EnergySettings) -> list[Row]:
    """Replay a simulated live fleet through the edge daemon; scoring CPU and the whole agent's, per 1,000."""
    from edge_agent.config import EdgeConfig
    from edge_agent.daemon import AgentDaemon

    fleet_dir = home / "live"
    if not (fleet_dir / "telemetry.csv").exists():
        write_fleet(FleetConfig(machines=machines, duration=f"{days}d", interval="10m", seed=12), fleet_dir)
    name = str(model["type"])
    config = EdgeConfig.from_dict(
        {
            "edge_id": f"bench-{name}",
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "sources": [
                {
                    "type": "replay",
                    "telemetry": str(fleet_dir / "telemetry.csv"),
                    "events": str(fleet_dir / "events.csv"),
                    "machines": str(fleet_dir / "machines.csv"),
                }
            ],
            "window": {"length": f"{WINDOW_H:g}h", "every": f"{EVERY_H:g}h", "min_points": 12},
            "model": {**model, "threads": 1, "horizon": f"{HORIZON_H:g}h"},
            "updates": {"enabled": False},
            "health": {"enabled": False},
            "log": {"level": "WARNING"},
            "state_dir": str(home / f"edge-{name}"),
        }
    )
    daemon = AgentDaemon(config, send=False)
    with CostMeter(energy) as meter:
        stats = daemon.run()
    scoring = estimate(daemon.agent.flow.scoring_cpu_s, stats.predictions, model=energy.power_model())
    note = f"{stats.readings:,} readings, {stats.predictions:,} windows scored in {meter.wall_s:.1f} s"
    explained = getattr(stats, "explained", 0)
    if explained:  # occlusion on the alerting windows: agent work beside scoring, on by default with the LM
        note += f"; {explained:,} alerting windows explained in {daemon.agent.explain_seconds:.1f} s"
    return [
        Row(f"edge scoring ({name})", "edge", scoring, note=note),
        Row(f"edge agent ({name})", "edge", meter.cost(stats.predictions), note="the whole process, scoring included"),
    ]


def ingest(messages: int, energy: EnergySettings) -> Row:
    """One bounded ingest run over ``messages`` predictions; its cost as the pipeline records it."""
    from pipelines.run import run_once
    from pipelines.run_log import CONSUMER
    from precursor.store.queries import reading
    from precursor.store.runs import last_run

    with own_topics("cost") as settings, tempfile.TemporaryDirectory() as tmp:
        producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=20, batch_size=256 * 1024)
        for key, value in predictions(messages):
            producer.send(settings.topics.predictions, key=key, value=value)
        for key, value in failure_events(messages):
            producer.send(settings.topics.events, key=key, value=value)
        producer.flush()
        producer.close()
        store = Path(tmp) / "store.duckdb"
        report = run_once(settings, store)
        with reading(store) as reader:
            recorded = last_run(reader, CONSUMER)
    assert recorded is not None
    cost = estimate(
        recorded["cpu_s"], recorded["predictions_read"], energy_j=recorded["energy_j"], model=energy.power_model()
    )
    note = f"{report.read:,} records stored in {report.seconds:.1f} s (local Beam runner)"
    return Row("pipeline ingest", "cloud", cost, note=note)


def show(rows: list[Row]) -> None:
    print()
    header = (
        f"{'part':<28} {'where':<6} {'CPU-s / 1,000':>14} {'J / 1,000':>11} {'Wh / 1,000':>11}  {'over':<28} energy"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        c = r.cost
        cpu = "-" if c.cpu_s_per_1000 is None else f"{c.cpu_s_per_1000:.4g}"
        joules = "-" if c.energy_j_per_1000 is None else f"{c.energy_j_per_1000:.4g}"
        wh = "-" if c.energy_j_per_1000 is None else f"{c.energy_j_per_1000 / 3600:.3g}"
        over = f"{c.cpu_s:.3g} CPU-s / {c.predictions:,} {'windows' if r.per != 'predictions' else 'pred.'}"
        print(f"{r.part:<28} {r.where:<6} {cpu:>14} {joules:>11} {wh:>11}  {over:<28} {c.energy_source}")
    print()
    for r in rows:
        if r.note:
            print(f"  {r.part}: {r.note}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machines", type=int, default=20, help="simulated machines (history and live)")
    parser.add_argument("--history-days", type=float, default=21.0, help="simulated history to train on")
    parser.add_argument("--live-days", type=float, default=7.0, help="simulated live fleet the edge scores")
    parser.add_argument("--max-steps", type=int, default=250, help="training steps")
    parser.add_argument("--messages", type=int, default=20_000, help="predictions the ingest run reads")
    parser.add_argument("--watts-per-core", type=float, default=None, help="the power model [PRECURSOR_ENERGY_*]")
    args = parser.parse_args(argv)
    energy = EnergySettings(**({"watts_per_core": args.watts_per_core} if args.watts_per_core else {}))
    rapl = energy.rapl()
    print(f"machine: {cpu_name()}, {cores()} cores usable, {platform.system()} {platform.release()}")
    print(f"date:    {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average {os.getloadavg()[0]:.2f}")
    print(f"energy:  {'RAPL counters readable' if rapl else 'no RAPL counters readable here'}; else "
          f"{energy.power_model().basis}")  # fmt: skip
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="precursor-cost-") as tmp:
        home = Path(tmp)
        started = time.perf_counter()
        trained, artifact, keys = retrain(home, args.machines, args.history_days, args.max_steps, energy)
        print(f"retrain: {time.perf_counter() - started:.0f} s")
        lm = {"type": "lm", "artifact": str(artifact), "trusted_keys": [str(keys)]}
        rows += edge(home, args.machines, args.live_days, lm, energy)
        rows += edge(home, args.machines, args.live_days, {"type": "drift-zscore"}, energy)
        rows.append(ingest(args.messages, energy))
        rows.append(trained)
    show(rows)
    by = {r.part: r.cost for r in rows}
    edge_lm, cloud = by["edge agent (lm)"], by["pipeline ingest"]
    if edge_lm.cpu_s_per_1000 and cloud.cpu_s_per_1000:
        print(
            f"\nedge vs cloud, per 1,000 predictions: the edge agent with the LM {edge_lm.cpu_s_per_1000:.3g} CPU-s, "
            f"cloud ingest {cloud.cpu_s_per_1000:.3g} CPU-s; retraining once adds "
            f"{by['retraining'].cpu_s:.3g} CPU-s in all"
        )


if __name__ == "__main__":
    main()
