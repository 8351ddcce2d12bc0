"""Pipeline throughput in predictions/s, per engine: ingest (Kafka -> validate -> dedupe -> store -> alerts) and
labeling (store -> labeled Parquet dataset).

Fills fresh topics with N Prediction messages from 1,000 machines (and a failure event for every tenth machine)
before any clock starts. Then, per engine: one bounded ingest run into a fresh store that reads, validates, drops
duplicates, stores and raises alerts for all of them; on the local engine also a re-run over the same offsets
(everything already stored: the idempotent path); and one labeling run over the stored predictions. Engines that
are not installed are reported as such (``precursor pipeline engines --install prism|flink``). Uses the configured
broker if it answers, else a temporary local one. The machine's load average is printed with the figures: on a
shared machine it says how far to trust them.

    .venv/bin/python bench/pipeline_throughput.py --messages 100000 --engines local,prism,flink

With ``--flink-cluster N``, ``flink`` runs on a local Flink cluster of N task managers started for the run
(``precursor flink up``; ingest in streaming mode, parallelism N) instead of the job server's embedded mini-cluster.

Ingest against the raw consumer: before any pipeline runs, kafka-python reads the same predictions straight off the
topic (no parsing, nothing stored), and the local ingest is set beside it, by wall clock and per CPU-second of this
process (the local runner runs in it; the broker's CPU is counted in neither). ``--before DIR`` also runs the local
ingest of another checkout (``git worktree add DIR <commit>``) over the same records in the same run, for a
before/after figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kafka import KafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_throughput import consume, predictions, reachable_broker

from infra.kafka_admin import admin_client, ensure_topics
from pipelines.engines import ENGINES, FLINK_POM, EngineError, EngineSettings, engine
from pipelines.labeling import run_labeling
from pipelines.run import run_once
from precursor.contracts.messages import EdgeEvent, Prediction, encode
from precursor.contracts.settings import KafkaSettings


def failure_events(count: int) -> list[tuple[bytes, bytes]]:
    """A failure for every tenth machine of :func:`predictions`, in the middle of its windows."""
    windows_per_machine = max(1, count // 1000)
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=10 * windows_per_machine // 2, hours=1)
    events = []
    for m in range(0, min(count, 1000), 10):
        machine = f"pump-{m:05d}"
        event = EdgeEvent(edge_id=f"edge-{m % 50:04d}", seq=10**9 + m, machine_id=machine, timestamp=at,
                          event="failure:bearing")  # fmt: skip
        events.append((machine.encode(), encode(event)))
    return events


def quiet_fleet(count: int, degrading_every: int = 50) -> list[tuple[bytes, bytes]]:
    """:func:`predictions` with the risks of a fleet that mostly runs well: every ``degrading_every``-th machine's
    failure risk climbs from 0.05 to 0.95 over its windows (it crosses the alert threshold once and stays above),
    every other machine's risks stay below 0.2. Same machines, edges, windows and message sizes; far fewer alerts
    than the default risks, which swing across the thresholds and raise or clear one for about a third of the
    predictions."""
    windows = max(1, count // 1000)
    pairs = []
    for key, value in predictions(count):
        message = Prediction.model_validate_json(value)
        machine = int(message.machine_id.rsplit("-", 1)[1])
        risk = {kind: 0.2 * p for kind, p in message.risk.items()}
        if machine % degrading_every == 0:
            risk["failure"] = 0.05 + 0.9 * (message.seq // 1000) / windows
        pairs.append((key, encode(message.model_copy(update={"risk": risk}))))
    return pairs


RAW = "raw consume, kafka-python (no parsing)"
LOCAL_INGEST = "ingest, local: all new"
BEFORE = "ingest, local, before"


def fill(settings: KafkaSettings, count: int, *, quiet: bool = False) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=20, batch_size=256 * 1024)
    for key, value in quiet_fleet(count) if quiet else predictions(count):
        producer.send(settings.topics.predictions, key=key, value=value)
    for key, value in failure_events(count):
        producer.send(settings.topics.events, key=key, value=value)
    producer.flush()
    producer.close()


def timed(label: str, count: int, work: object) -> tuple[str, int, float, float]:
    """``(label, count, wall seconds, CPU seconds of this process)``."""
    started, cpu = time.perf_counter(), time.process_time()
    work()  # type: ignore[operator]
    return label, count, time.perf_counter() - started, time.process_time() - cpu


_BEFORE = """
import json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from precursor.contracts.settings import KafkaSettings
from pipelines.run import run_once
settings = KafkaSettings.model_validate_json(sys.argv[2])
with tempfile.TemporaryDirectory() as folder:
    started, cpu = time.perf_counter(), time.process_time()
    report = run_once(settings, Path(folder) / "before.duckdb", from_beginning=True)
    print(json.dumps([time.perf_counter() - started, time.process_time() - cpu, report.stored]))
"""


def ingest_before(tree: Path, settings: KafkaSettings) -> tuple[float, float, int]:
    """Wall and CPU seconds of the local ingest of the checkout at ``tree``, in a process of its own (imports not
    timed), and how many records it stored."""
    done = subprocess.run(
        [sys.executable, "-c", _BEFORE, str(tree), settings.model_dump_json()],
        capture_output=True, text=True, check=True, cwd=tree,
    )  # fmt: skip
    wall, cpu, stored = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, cpu, stored


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--engines", default="local,prism,flink", help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--flink-cluster", type=int, default=0, metavar="N", help="run flink on N task managers")
    parser.add_argument("--before", type=Path, metavar="DIR", help="also time the local ingest of the checkout in DIR")
    parser.add_argument(
        "--quiet-fleet",
        action="store_true",
        help="risks of a fleet that mostly runs well (one machine in 50 degrades and alerts once) instead of the "
        "default risks, which raise or clear an alert for about a third of the predictions",
    )
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        engine_settings = EngineSettings()
        flink_args: list[str] = []
        if args.flink_cluster:
            engine_settings, where = stack.enter_context(flink_cluster(engine_settings, args.flink_cluster))
            flink_args = ["--streaming"]
            print(f"# flink: {where}")
        measure(args, engine_settings, flink_args)


@contextmanager
def flink_cluster(settings: EngineSettings, taskmanagers: int) -> Iterator[tuple[EngineSettings, str]]:
    """A local Flink cluster for the run, on free ports, and engine settings that send flink jobs to it."""
    from infra.flink_cluster import FLINK_CLUSTER_LOGGING_POM, LocalFlinkCluster
    from infra.maven_jars import pom_digest, resolve_runtime_jars
    from infra.processes import free_ports

    rest, rpc, pool = free_ports(3)
    with tempfile.TemporaryDirectory() as state:
        cluster = LocalFlinkCluster(
            state_dir=state,
            flink_jars=settings.flink_jars_root / pom_digest(FLINK_POM),
            logging_jars=resolve_runtime_jars(FLINK_CLUSTER_LOGGING_POM, settings.flink_cluster_jars_root),
            taskmanagers=taskmanagers,
            rest_port=rest,
            rpc_port=rpc,
            worker_pool_port=pool,
        )
        cluster.up(report=lambda line: None)
        try:
            yield (
                settings.model_copy(
                    update={
                        "flink_master": cluster.master,
                        "flink_environment": "EXTERNAL",
                        "flink_environment_config": f"{cluster.host}:{cluster.worker_pool_port}",
                        "parallelism": taskmanagers,
                    }
                ),
                f"a local cluster of {taskmanagers} task managers (streaming ingest, parallelism {taskmanagers})",
            )
        finally:
            cluster.down(report=lambda line: None)


def measure(args: argparse.Namespace, engine_settings: EngineSettings, flink_args: list[str]) -> None:
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    print(
        f"# pipeline throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"
    )
    available, missing = [], {}
    for name in names:
        try:
            engine(name, [], engine_settings)
            available.append(name)
        except EngineError as err:
            missing[name] = str(err)
    rows: list[tuple[str, int, float, float]] = []
    load_before = os.getloadavg()[0]
    with reachable_broker(KafkaSettings()) as (base, where):
        settings = base.model_copy(update={"topic_prefix": f"bench{uuid.uuid4().hex[:6]}"})
        specs = settings.topics.specs()
        ensure_topics(settings, specs)
        try:
            fill(settings, args.messages, quiet=args.quiet_fleet)
            partitions = next(s.partitions for s in specs if s.name == settings.topics.predictions)
            rows.append(timed(RAW, args.messages, lambda: consume(settings, settings.topics.predictions, partitions,
                                                                  args.messages)))  # fmt: skip
            if args.before:
                wall, cpu, stored = ingest_before(args.before, settings)
                assert stored == args.messages + len(failure_events(args.messages)), stored
                rows.append((f"{BEFORE}: all new", args.messages, wall, cpu))
            alerts: dict[str, tuple[int, int]] = {}
            with tempfile.TemporaryDirectory() as folder:
                for name in available:
                    store = Path(folder) / f"{name}.duckdb"
                    report = {}

                    def ingest(name: str = name, store: Path = store, report: dict = report) -> None:
                        report["first"] = run_once(settings, store, runner=name, engine_settings=engine_settings,
                                                   from_beginning=True,
                                                   beam_args=flink_args if name == "flink" else None)  # fmt: skip

                    rows.append(timed(f"ingest, {name}: all new", args.messages, ingest))
                    assert report["first"].stored == args.messages + len(failure_events(args.messages)), report
                    alerts[name] = (report["first"].alerts_raised, report["first"].alerts_cleared)
                    if name == "local":

                        def again(store: Path = store, report: dict = report) -> None:
                            report["again"] = run_once(settings, store, from_beginning=True)

                        rows.append(timed("ingest, local: all already stored", args.messages, again))
                        assert report["again"].stored == 0, report

                    def label(name: str = name, store: Path = store) -> None:
                        run_labeling(store, Path(folder) / f"labels-{name}", runner=name,
                                     engine_settings=engine_settings)  # fmt: skip

                    rows.append(timed(f"labeling, {name}", args.messages, label))
        finally:
            with admin_client(settings, timeout_s=10) as admin:
                admin.delete_topics([s.name for s in specs], raise_errors=False)
    print(f"broker: {where}")
    print(f"risks: {'a quiet fleet (--quiet-fleet)' if args.quiet_fleet else 'the default synthetic risks'}; alerts "
          + ", ".join(f"{name}: {up:,} raised, {down:,} cleared" for name, (up, down) in alerts.items()))  # fmt: skip
    print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'run':<42}{'predictions':>12}{'seconds':>10}{'predictions/s':>16}{'CPU s':>8}{'per CPU s':>12}")
    for label, count, seconds, cpu in rows:
        # Other engines work in processes of their own: this process's CPU says nothing about them.
        own = label == RAW or ", local" in label
        per_cpu = f"{cpu:>8.2f}{count / cpu:>12,.0f}" if own and cpu > 0 else ""
        print(f"{label:<42}{count:>12}{seconds:>10.2f}{count / seconds:>16,.0f}{per_cpu}")
    rates = {label: (count / seconds, count / cpu if cpu > 0 else 0.0) for label, count, seconds, cpu in rows}
    if RAW in rates and LOCAL_INGEST in rates:
        (raw_wall, raw_cpu), (wall, cpu) = rates[RAW], rates[LOCAL_INGEST]
        print(f"local ingest / raw consume: {wall / raw_wall:.1%} by wall clock, {cpu / raw_cpu:.1%} per CPU-second")
        before = next((r for label, r in rates.items() if label.startswith(BEFORE)), None)
        if before:
            print(f"local ingest against before: {wall / before[0]:.2f}x by wall clock, "
                  f"{cpu / before[1]:.2f}x per CPU-second; before / raw consume: {before[0] / raw_wall:.1%} by wall "
                  f"clock, {before[1] / raw_cpu:.1%} per CPU-second")  # fmt: skip
    for name, why in missing.items():
        print(f"{name}: not measured: {why}")


if __name__ == "__main__":
    main()
