"""Wall time of the ``retrain`` flow for N labeled windows, in total and per task.

Before any clock starts: a simulated fleet sized to give N windows (6 h windows every 3 h, 30-minute readings) is
written in the generic formats, its windows are labeled and written as the labeling pipeline's dataset, a signing
key pair is made and a local Prefect server is started. Then one ``retrain`` runs end to end into an empty registry
(read the evidence -> train -> judge -> export int8 ONNX and sign -> register; no Kafka rollout) and the flow's wall
time is printed with each task's, as the Prefect server recorded them. Training runs ``--max-steps`` steps of the
default model (the default budget, 3000 steps or 8 minutes, bounds it in real runs). The machine's load average is
printed with the figures: on a shared machine it says how far to trust them.

    .venv/bin/python bench/retrain_wall_time.py --windows 100000 --max-steps 300
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from pathlib import Path

from infra.prefect_server import OFFLINE_ENVIRONMENT, LocalPrefectServer
from infra.processes import free_ports

WINDOW_H, EVERY_H, INTERVAL_MIN = 6, 3, 30
WINDOW_YIELD = 0.95
"""Share of a machine's window ends that become windows: a machine down for repair after a failure reports nothing."""


def fleet_shape(windows: int, days: float) -> int:
    """Machines needed for at least ``windows`` windows over ``days`` days."""
    return max(1, math.ceil(windows / (days * 24 / EVERY_H * WINDOW_YIELD)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=100_000, help="labeled windows in the evidence")
    parser.add_argument("--days", type=float, default=60.0, help="days of history they span")
    parser.add_argument("--max-steps", type=int, default=300, help="training steps of the candidate")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training")
    args = parser.parse_args()
    for key, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.labeled import write_history
    from flows.retrain import retrain
    from flows.settings import RetrainSettings
    from models.edge.signing import generate_keypair
    from models.training.dataset import Fleet, build_windows
    from models.training.train import TrainSettings
    from precursor.simulator import FleetConfig, write_fleet

    with tempfile.TemporaryDirectory(prefix="retrain-bench-") as scratch:
        root = Path(scratch)
        machines = fleet_shape(args.windows, args.days)
        prepared = time.monotonic()
        files = write_fleet(
            FleetConfig(machines=machines, duration=f"{args.days:g}d", interval=f"{INTERVAL_MIN}m", seed=1),
            root / "fleet",
        )
        training = TrainSettings(
            horizon_h=24.0, window_h=WINDOW_H, every_h=EVERY_H, max_steps=args.max_steps, threads=args.threads
        )
        fleet = Fleet.load(files.telemetry, files.events, files.machines)
        windows = build_windows(fleet, training.window_spec())
        write_history(windows, root / "labeled", horizon_h=24.0)
        keys = generate_keypair(root / "keys")
        server = LocalPrefectServer(state_dir=root / "state", port=free_ports(1)[0], ui=False)
        server.up(timeout_s=240)
        print(
            f"prepared in {time.monotonic() - prepared:.0f} s: {machines} machines x {args.days:g} days, "
            f"{files.summary.rows:,} readings, {len(windows):,} labeled windows "
            f"({sum(w.failed for w in windows):,} failed)"
        )
        settings = RetrainSettings(
            labeled_dataset=root / "labeled",
            telemetry=files.telemetry,
            events=files.events,
            machines=files.machines,
            work_dir=root / "work",
            registry=root / "registry",
            signing_key=keys.private_key_path,
            trusted_keys=[keys.public_key_path],
            training=training,
            publish=False,
        )
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
                started = time.monotonic()
                state = retrain(settings, return_state=True)
                wall = time.monotonic() - started
                with get_client(sync_client=True) as client:
                    tasks = client.read_task_runs(
                        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
                    )
            report = state.result()
        finally:
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)  # the run's last logs, while the server still listens
            server.down()
    load = os.getloadavg()
    print(f"retrain of {len(windows):,} labeled windows: {wall:.1f} s wall ({report.outcome})")
    for task in sorted(tasks, key=lambda t: t.start_time or t.expected_start_time):
        print(f"  {task.name.rsplit('-', 1)[0]:<18} {task.total_run_time.total_seconds():7.1f} s")
    print(
        f"training: {args.max_steps} steps, {args.threads} torch threads; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


if __name__ == "__main__":
    main()
