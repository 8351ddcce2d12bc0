"""A fleet under load: many edge agents into a three-broker Kafka cluster, the Flink pipeline and PostgreSQL, with one
broker and one TaskManager killed mid-run; nothing lost, nothing doubled.

What runs, all started here on free ports under a temporary folder and all stopped at the end (also on Ctrl-C):

- PostgreSQL (``infra.postgres_server``), the prediction store;
- a three-node KRaft cluster (``infra.kafka_cluster``): every topic on three nodes, ``min.insync.replicas=2``;
- a Flink cluster (``infra.flink_cluster``): a JobManager, two TaskManagers of one slot and the SDK worker pool;
- the pipeline driver: ``precursor pipeline run --follow --runner flink --beam-arg=--streaming`` as its own process
  (it starts Beam's job server JVM for every bounded run);
- ``--edges`` real edge agents (``edge_agent.daemon.AgentDaemon``: each its own edge_id, state folder, SQLite
  outbox, sequence numbers and Kafka producer), run as threads in ``--processes`` worker processes, since a hundred
  interpreters would not fit the box. Each simulates ``--machines / --edges`` machines of its own (the built-in
  simulator, one reading per machine every 2 simulated minutes, at ``--speedup``) and scores a one-hour window per
  machine every 10 simulated minutes with the default scorer (drift-zscore). Edges start staggered over one period,
  so the fleet's readings spread over time as a real fleet's do.

The load is ``machines x speedup / 600`` predictions/s (one per machine per 600 / speedup wall seconds), and five
times as many readings; the first predictions come once a machine has a window's worth (about 700 / speedup s).
Mid-run the leader of a predictions partition is SIGKILLed (restarted ``--broker-down-s`` later, as a supervisor
would) and then a TaskManager (restarted ``--taskmanager-down-s`` later); the pipeline's failed runs are retried from
the store's offsets. After ``--minutes`` the edges are stopped (each drains its outbox into Kafka), the pipeline
catches up, and the books are closed: each edge's own count of predictions against the store's rows for that edge.

Measured: predictions/s made and stored, the delay from a prediction's making at the edge (``emitted_at``) to its row
being written in the store (``ingested_at``, stamped in the transaction that makes it queryable), consumer lag
(records on the predictions topic past the store's committed offsets) over time, and CPU-seconds per 1,000
predictions per stage from /proc (process trees: edges, brokers, Flink JobManager, TaskManagers, SDK worker pool,
PostgreSQL, pipeline driver with its job server).

    .venv/bin/python bench/fleet_load.py --short --speedup 30         # 10 edges, 1,000 machines, 2 minutes
    .venv/bin/python bench/fleet_load.py --edges 100 --machines 10000 --minutes 10
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_accounting import Books, StageMeter, StoredRows, reconcile  # noqa: E402

READING_S = 120  # one reading per machine every 2 simulated minutes
WINDOW_EVERY_S = 600  # one window of the last hour scored per machine every 10 simulated minutes
STAGES = ("edges", "kafka brokers", "flink jobmanager", "flink taskmanagers", "sdk worker pool", "postgresql",
          "pipeline driver")  # fmt: skip


def say(line: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {line}", flush=True)


# --- the edges: many agents in one worker process ---------------------------------------------------------------


def edge_config(index: int, args: argparse.Namespace, root: Path, machines: int) -> Any:
    from edge_agent.config import EdgeConfig

    edge_id = f"edge-{index:03d}"
    return EdgeConfig.model_validate(
        {
            "edge_id": edge_id,
            "kafka": {"bootstrap_servers": args.bootstrap, "topic_prefix": args.prefix},
            "sources": [
                {
                    "type": "simulator",
                    "machines": machines,
                    "seed": index,
                    "speedup": args.speedup,
                    "interval": f"{READING_S}s",
                    "machine_prefix": f"e{index:03d}",
                }
            ],
            "window": {"length": "1h", "every": f"{WINDOW_EVERY_S}s", "min_points": 3},
            "health": {"enabled": False},
            "updates": {"enabled": False},
            "log": {"level": "WARNING"},
            "state_dir": str(root / edge_id),
            "exit_when_sources_end": False,
            "drain_timeout": f"{args.drain_s}s",
        }
    )


def run_worker(args: argparse.Namespace) -> None:
    """Edges ``first..last-1`` as threads; on SIGTERM each drains into Kafka; their counts go to ``--counts``."""
    from edge_agent.daemon import AgentDaemon

    logging.basicConfig(level=logging.WARNING)
    first, last = (int(x) for x in args.worker.split(":"))
    root = Path(args.worker_root)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    signal.signal(signal.SIGINT, lambda _s, _f: stop.set())
    period_s = WINDOW_EVERY_S / args.speedup
    daemons: dict[int, AgentDaemon] = {}
    threads: list[threading.Thread] = []
    for index in range(first, last):
        # Staggered over one period (or a quarter of the run, if shorter), by the edge's place in the whole fleet.
        at = args.started + index * min(period_s, args.minutes * 15) / args.edges
        while not stop.is_set() and time.time() < at:
            stop.wait(min(0.5, max(0.0, at - time.time())))
        if stop.is_set():
            break
        daemon = AgentDaemon(edge_config(index, args, root, args.per_edge))
        daemons[index] = daemon
        thread = threading.Thread(target=daemon.run, name=f"edge-{index:03d}", daemon=True)
        thread.start()
        threads.append(thread)
    stop.wait()
    for daemon in daemons.values():
        daemon.request_stop()
    for thread in threads:
        thread.join()
    counts = {
        d.config.edge_id: d.agent.stats.as_dict()
        | {"outbox_left": d.outbox.depth, "sent": d.sender.sent if d.sender else 0}
        for d in daemons.values()
    }
    Path(args.counts).write_text(json.dumps(counts))


# --- the services -----------------------------------------------------------------------------------------------


@dataclass
class Services:
    root: Path
    store_url: str
    postgres: Any
    kafka: Any
    flink: Any
    env: dict[str, str]
    prefix: str = "fleet"
    driver: subprocess.Popen[bytes] | None = None
    workers: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)


@contextmanager
def postgres(root: Path) -> Iterator[tuple[Any, str]]:
    from infra.postgres_server import LocalPostgres

    root.mkdir(parents=True)
    root.chmod(0o755)  # a server started by root runs as postgres, which must reach its data
    server = LocalPostgres(root / "pg")
    server.up(report=say)
    try:
        yield server, server.create_database("fleet")
    finally:
        server.down(report=say, immediate=True)


@contextmanager
def kafka_cluster(root: Path) -> Iterator[Any]:
    from infra.kafka_broker import LocalKafka
    from infra.kafka_cluster import LocalKafkaCluster
    from infra.processes import free_ports

    first = free_ports(6, consecutive=True)[0]  # each of three nodes takes a client and a controller port
    lib = LocalKafka(state_dir=Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))).jars_root
    cluster = LocalKafkaCluster(state_dir=root, brokers=3, first_port=first, lib_dir=lib, topic_prefix="fleet")
    try:
        cluster.up(report=say)
        yield cluster
    finally:
        cluster.down(report=say)


@contextmanager
def flink_cluster(root: Path) -> Iterator[Any]:
    from infra.flink_cluster import FLINK_CLUSTER_LOGGING_POM, LocalFlinkCluster
    from infra.maven_jars import pom_digest, resolve_runtime_jars
    from infra.processes import free_ports
    from pipelines.engines import FLINK_POM, EngineSettings

    settings = EngineSettings()
    rest, rpc, pool = free_ports(3)
    cluster = LocalFlinkCluster(
        state_dir=root,
        flink_jars=settings.flink_jars_root / pom_digest(FLINK_POM),
        logging_jars=resolve_runtime_jars(FLINK_CLUSTER_LOGGING_POM, settings.flink_cluster_jars_root),
        taskmanagers=2,
        rest_port=rest,
        rpc_port=rpc,
        worker_pool_port=pool,
    )
    try:
        cluster.up(report=say)
        yield cluster
    finally:
        cluster.down(report=say)


def start_driver(services: Services) -> subprocess.Popen[bytes]:
    log = (services.root / "driver.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "precursor", "pipeline", "run", "--follow", "--store", services.store_url,
         "--runner", "flink", "--beam-arg=--streaming"],
        stdout=log, stderr=subprocess.STDOUT, env=services.env, cwd=REPO_ROOT, start_new_session=True,
    )  # fmt: skip


def start_workers(services: Services, args: argparse.Namespace, started: float) -> None:
    per_edge = args.machines // args.edges
    bounds = [round(i * args.edges / args.processes) for i in range(args.processes + 1)]
    for first, last in itertools.pairwise(bounds):
        counts = services.root / f"counts-{first}.json"
        command = [
            sys.executable, __file__, "--worker", f"{first}:{last}", "--worker-root", str(services.root / "edges"),
            "--counts", str(counts), "--bootstrap", services.kafka.bootstrap, "--prefix", services.prefix,
            "--speedup", str(args.speedup), "--per-edge", str(per_edge), "--edges", str(args.edges),
            "--minutes", str(args.minutes), "--started", str(started), "--drain-s", str(args.drain_s),
        ]  # fmt: skip
        log = (services.root / f"worker-{first}.log").open("wb")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True)
        services.workers.append((process, counts))


def stop_process(process: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> None:
    """Signal a process we started, wait, then SIGKILL its whole session (it leads one) if it is still there."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def kill_session_leftovers(process: subprocess.Popen[bytes] | None) -> None:
    """Whatever still runs in a stopped process's session (a job server JVM its runner started)."""
    if process is None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


# --- measuring --------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    stored: int
    in_kafka: int | None  # predictions the edges have delivered to the topic so far
    lag: int | None
    cpu: dict[str, float]


def store_count(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        row = con.execute("SELECT count(*) FROM predictions").fetchone()
    return int(row[0]) if row else 0


def predictions_lag(services: Services) -> tuple[int | None, int | None]:
    """Records on the predictions topic in all, and past the store's committed offsets; None when the cluster did
    not answer."""
    from pipelines.kafka_io import plan_ranges
    from pipelines.run_log import CONSUMER
    from precursor.store import PredictionStore

    settings = services.kafka.kafka_settings(services.prefix)
    try:
        committed = PredictionStore(services.store_url).offsets(CONSUMER, settings.topics.predictions)
        ranges = plan_ranges(settings, settings.topics.predictions, committed)
    except Exception:  # a broker just died: the next sample asks again
        return None, None
    return sum(r.end for r in ranges), sum(r.size for r in ranges)


def register(meter: StageMeter, services: Services) -> None:
    """The current roots of every stage (a restarted broker or TaskManager is a new one)."""
    for process, _ in services.workers:
        meter.add("edges", process.pid)
    for node in services.kafka.nodes():
        meter.add("kafka brokers", node.service.running_pid())
    flink = services.flink
    meter.add("flink jobmanager", flink.jobmanager().running_pid())
    for index in range(1, flink.taskmanagers + 1):
        meter.add("flink taskmanagers", flink.taskmanager(index).running_pid())
    meter.add("sdk worker pool", flink.worker_pool().running_pid())
    pid_file = services.postgres.data_dir / "postmaster.pid"
    if pid_file.is_file():
        meter.add("postgresql", int(pid_file.read_text().split()[0]))
    if services.driver is not None:
        meter.add("pipeline driver", services.driver.pid)


@dataclass
class Drill:
    """One fault at ``at`` seconds into the load, undone ``down_s`` later (a supervisor restarting what died)."""

    name: str
    at: float
    down_s: float
    kill: Callable[[], str]
    restart: Callable[[], None]
    killed_at: float | None = None
    restarted_at: float | None = None
    what: str = ""


def drills(services: Services, args: argparse.Namespace) -> list[Drill]:
    kafka, flink = services.kafka, services.flink
    load_s = args.minutes * 60

    def kill_leader() -> str:
        leader = kafka.replicas(f"{services.prefix}.predictions")[0].leader
        pid = kafka.kill(leader)
        return f"broker {leader} (leader of predictions partition 0), pid {pid}"

    def kill_taskmanager() -> str:
        return f"TaskManager 1, pid {flink.kill_taskmanager(1)}"

    return [
        Drill("broker", args.kill_broker_at * load_s, args.broker_down_s, kill_leader,
              lambda: kafka.up(report=say)),
        Drill("taskmanager", args.kill_taskmanager_at * load_s, args.taskmanager_down_s, kill_taskmanager,
              lambda: flink.up(report=say)),
    ]  # fmt: skip


def run_drills(faults: list[Drill], meter: StageMeter, elapsed: float, started: float) -> None:
    """Kill what is due to die, restart what has been down long enough."""
    for drill in faults:
        if drill.killed_at is None and elapsed >= drill.at:
            meter.sample()  # the seconds of the process about to die
            drill.what = drill.kill()
            drill.killed_at = elapsed
            say(f"killed {drill.what} at {elapsed:.0f} s")
        elif drill.killed_at is not None and drill.restarted_at is None and elapsed >= drill.killed_at + drill.down_s:
            drill.restart()
            drill.restarted_at = time.time() - started
            say(f"restarted the {drill.name} at {drill.restarted_at:.0f} s")


def produced_counts(services: Services) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for _, counts in services.workers:
        out.update(json.loads(counts.read_text()))
    return out


def stored_by_edge(url: str) -> dict[str, StoredRows]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        rows = con.execute(
            "SELECT edge_id, count(*), count(DISTINCT (machine_id, window_end)) FROM predictions GROUP BY edge_id"
        ).fetchall()
    return {str(edge): StoredRows(int(n), int(d)) for edge, n, d in rows}


def delays(url: str, since: datetime | None = None) -> dict[str, float]:
    """Seconds from ``emitted_at`` to ``ingested_at``: p50, p95, p99, max (of predictions made after ``since``)."""
    import psycopg

    where = "" if since is None else "WHERE emitted_at >= %s"
    with psycopg.connect(url, autocommit=True) as con:
        row = con.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.95) WITHIN GROUP (ORDER BY d),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d), count(*) FROM (SELECT EXTRACT(EPOCH FROM"
            f" ingested_at - emitted_at) AS d FROM predictions {where}) AS x",
            [] if since is None else [since],
        ).fetchone()
    assert row is not None
    return {k: float(v or 0.0) for k, v in zip(("p50", "p95", "p99", "max", "count"), row, strict=True)}


@dataclass(frozen=True)
class DriverRuns:
    """What the pipeline driver said of its runs (a line per run with records, a line per failed run)."""

    with_records: int
    failed: int
    already_stored: int
    duplicates: int


def driver_runs(services: Services) -> DriverRuns:
    lines = (services.root / "driver.log").read_text(errors="replace").splitlines()
    runs = [line for line in lines if line.startswith("pipeline: read ")]
    runs = runs[:-1] if services.driver is not None and services.driver.poll() is not None else runs  # the total

    def figure(line: str, name: str) -> int:
        return int(line.split(f"{name} ", 1)[1].split(",", 1)[0].split(" ", 1)[0])

    return DriverRuns(
        with_records=len(runs),
        failed=sum(1 for line in lines if line.startswith("pipeline: run failed")),
        already_stored=sum(figure(line, "already stored") for line in runs),
        duplicates=sum(figure(line, "duplicates dropped") for line in runs),
    )


def rate(samples: list[Sample], since: float, until: float, value: Callable[[Sample], int | None]) -> float | None:
    """Per second, between the first sample at or after ``since`` and the last at or before ``until`` that have it."""
    inside = [s for s in samples if since <= s.t <= until and value(s) is not None]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    return (value(inside[-1]) - value(inside[0])) / (inside[-1].t - inside[0].t)  # type: ignore[operator]


# --- the run ----------------------------------------------------------------------------------------------------


def interrupted(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: the same way out, through every stop below."""
    raise KeyboardInterrupt


def run_load(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="precursor-fleet-"))
    root.chmod(0o755)
    previous = signal.signal(signal.SIGTERM, interrupted)
    load_before = os.getloadavg()
    say(f"fleet load: {args.edges} edges, {args.machines} machines, {args.minutes} min, speedup {args.speedup:g} "
        f"(load {args.machines * args.speedup / WINDOW_EVERY_S:,.1f} predictions/s), state {root}")  # fmt: skip
    services: Services | None = None
    try:
        with ExitStack() as stack:
            server, url = stack.enter_context(postgres(root / "postgres"))
            # Before the Flink cluster starts: its SDK worker pool hands this environment to the workers that write.
            os.environ["PGPASSFILE"] = str(server.pgpass)
            kafka = stack.enter_context(kafka_cluster(root / "kafka"))
            flink = stack.enter_context(flink_cluster(root / "flink"))
            from pipelines.engines import EngineSettings

            env = os.environ | server.client_env() | flink.engine_environment()
            env |= {"PRECURSOR_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap, "PRECURSOR_KAFKA_TOPIC_PREFIX": "fleet",
                    "PRECURSOR_STATE_DIR": str(root / "state"),
                    "PRECURSOR_ENGINE_ROOT": str(EngineSettings().install_root.absolute())}  # fmt: skip
            services = Services(root, url, server, kafka, flink, env)
            from precursor.store import connect

            with connect(url):  # the schema, before the first run and the first sample
                pass
            services.driver = start_driver(services)
            stack.callback(lambda: kill_session_leftovers(services.driver if services else None))
            stack.callback(lambda: stop_process(services.driver if services else None, signal.SIGINT, 60))
            started = time.time()
            start_workers(services, args, started)
            for process, _ in services.workers:
                stack.callback(lambda p=process: stop_process(p, signal.SIGKILL, 5))
            measure(services, args, started)
    except KeyboardInterrupt:
        say("interrupted: stopping everything that was started")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        print(f"load average (1 min): {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")


def measure(services: Services, args: argparse.Namespace, started: float) -> None:
    meter = StageMeter()
    samples: list[Sample] = []
    faults = drills(services, args)
    load_s = args.minutes * 60
    load_started = datetime.now(UTC)

    def sample() -> None:
        register(meter, services)
        meter.sample()
        samples.append(Sample(time.time() - started, store_count(services.store_url), *predictions_lag(services),
                              meter.seconds()))  # fmt: skip

    next_report = 0.0
    while (elapsed := time.time() - started) < load_s:
        run_drills(faults, meter, elapsed, started)
        if services.driver is not None and services.driver.poll() is not None:
            raise RuntimeError(f"the pipeline driver exited ({services.driver.returncode}); see its log")
        sample()
        if elapsed >= next_report:
            last = samples[-1]
            say(f"{elapsed:5.0f} s: in Kafka {last.in_kafka}, stored {last.stored:,}, lag {last.lag}")
            next_report = elapsed + 30
        time.sleep(args.sample_s)
    load_ended = time.time() - started
    for drill in faults:  # what is still down comes back now, as its supervisor would have brought it back
        if drill.killed_at is not None and drill.restarted_at is None:
            drill.restart()
            drill.restarted_at = time.time() - started
            say(f"restarted the {drill.name} at {drill.restarted_at:.0f} s")
    stored_at_load_end = store_count(services.store_url)
    say(f"load over at {load_ended:.0f} s: stopping the edges (each drains its outbox into Kafka)")
    for process, _ in services.workers:
        process.send_signal(signal.SIGTERM)
    for process, _ in services.workers:
        process.wait(args.drain_s + 120)
        meter.sample()
    produced = produced_counts(services)
    made = sum(c["predictions"] for c in produced.values())
    say(f"edges stopped at {time.time() - started:.0f} s: {made:,} predictions made; waiting for the store")
    deadline = time.time() + args.catch_up_s
    while time.time() < deadline:
        sample()
        if samples[-1].stored >= made and samples[-1].lag == 0:
            break
        time.sleep(args.sample_s)
    caught_up = time.time() - started
    meter.sample()
    cpu = meter.seconds()
    report(services, args, samples, faults, produced, cpu, load_started, load_ended, stored_at_load_end, caught_up)


def report(
    services: Services,
    args: argparse.Namespace,
    samples: list[Sample],
    faults: list[Drill],
    produced: dict[str, dict[str, int]],
    cpu: dict[str, float],
    load_started: datetime,
    load_ended: float,
    stored_at_load_end: int,
    caught_up: float,
) -> None:
    books: Books = reconcile({e: c["predictions"] for e, c in produced.items()}, stored_by_edge(services.store_url))
    runs = driver_runs(services)
    delay = delays(services.store_url)
    readings = sum(c["readings"] for c in produced.values())
    left = sum(c["outbox_left"] for c in produced.values())
    half = load_ended / 2
    into_kafka, stored_late = (rate(samples, half, load_ended, lambda s: s.in_kafka),
                               rate(samples, half, load_ended, lambda s: s.stored))  # fmt: skip
    print()
    print(f"# fleet load, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores")
    print("command: " + " ".join([".venv/bin/python", "bench/fleet_load.py", *sys.argv[1:]]))
    print(f"edges {len(produced)} in {args.processes} processes, machines {args.machines:,}, speedup {args.speedup:g}, "
          f"load {load_ended:.0f} s, scorer drift-zscore")  # fmt: skip
    print(f"readings {readings:,}; predictions made {books.produced:,}, stored {books.stored:,}; "
          f"lost {books.lost}, doubled {books.doubled}; left in outboxes {left}")  # fmt: skip
    if books.edges_short or books.edges_over:
        print(f"edges short: {books.edges_short}; edges with more rows than predictions: {books.edges_over}")
    print(f"made/s over the whole load: {books.produced / load_ended:,.1f} (ramp-up included); over its second half: "
          f"into Kafka {into_kafka or 0:,.1f}/s, stored {stored_late or 0:,.1f}/s")  # fmt: skip
    print(f"stored/s over the load: {stored_at_load_end / load_ended:,.1f}; all stored {caught_up - load_ended:.0f} s "
          f"after the edges stopped (stored/s end to end {books.stored / caught_up:,.1f})")  # fmt: skip
    print(f"made at the edge -> written in the store (s): p50 {delay['p50']:.1f}, p95 {delay['p95']:.1f}, "
          f"p99 {delay['p99']:.1f}, max {delay['max']:.1f} over {int(delay['count']):,}")  # fmt: skip
    print(f"pipeline runs with records {runs.with_records}, failed runs retried {runs.failed}; records read again "
          f"and found stored {runs.already_stored:,}, duplicates dropped {runs.duplicates:,}")  # fmt: skip
    for drill in faults:
        if drill.killed_at is not None:
            back = f", restarted at {drill.restarted_at:.0f} s" if drill.restarted_at is not None else ""
            print(f"fault: killed {drill.what} at {drill.killed_at:.0f} s{back}")
    lags = [s.lag for s in samples if s.lag is not None]
    print(f"lag (records behind on predictions): max {max(lags, default=0):,}; over time (s: records):")
    step = max(1, len(samples) // 24)
    print("  " + ", ".join(f"{s.t:.0f}: {s.lag if s.lag is not None else '-'}" for s in samples[::step]))
    print(f"{'stage':<22}{'CPU s':>10}{'CPU s / 1,000 predictions':>28}")
    total = 0.0
    for stage in STAGES:
        seconds = cpu.get(stage, 0.0)
        total += seconds
        print(f"{stage:<22}{seconds:>10.1f}{1000 * seconds / max(1, books.stored):>28.2f}")
    print(f"{'all':<22}{total:>10.1f}{1000 * total / max(1, books.stored):>28.2f}")
    if books.lost or books.doubled or left:
        raise SystemExit("predictions lost, doubled or left undelivered: see above")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=100)
    parser.add_argument("--machines", type=int, default=10_000, help="in all, split evenly over the edges")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the edges make predictions")
    parser.add_argument("--speedup", type=float, default=3.0, help="simulated seconds per wall second")
    parser.add_argument("--processes", type=int, default=4, help="worker processes the edges run in")
    parser.add_argument("--short", action="store_true", help="10 edges, 1,000 machines, 2 minutes (development)")
    parser.add_argument("--kill-broker-at", type=float, default=0.3, help="share of the load time")
    parser.add_argument("--broker-down-s", type=float, default=60.0)
    parser.add_argument("--kill-taskmanager-at", type=float, default=0.6, help="share of the load time")
    parser.add_argument("--taskmanager-down-s", type=float, default=20.0)
    parser.add_argument("--drain-s", type=float, default=120.0, help="each edge's outbox drain at the end")
    parser.add_argument("--catch-up-s", type=float, default=600.0, help="how long the store may take afterwards")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--keep", action="store_true", help="keep the state folder (logs) afterwards")
    # A worker process (started by the run itself).
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-root", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--per-edge", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # a killed broker is the point, not news
    if args.short:
        args.edges, args.machines, args.minutes, args.processes = 10, 1000, 2.0, 2
        args.broker_down_s, args.taskmanager_down_s = 15.0, 10.0
    run_load(args)


if __name__ == "__main__":
    main()
