"""The same pipelines on other engines: Beam's portable Prism runner and a Flink cluster give the local results.

The Flink runs go to a real local cluster (``precursor flink up``: a JobManager, two TaskManagers and the SDK worker
pool, each a process of its own), with parallelism 2 over the two task managers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.flink_runner import FlinkRunner

from infra.beam_worker_pool import WorkerPool
from infra.flink_cluster import LocalFlinkCluster
from infra.processes import free_ports
from pipelines.engines import (
    FLINK,
    FLINK_LAUNCHER,
    LOCAL,
    PRISM,
    EngineError,
    EngineSettings,
    engine,
    install_flink,
    install_prism,
)
from pipelines.labeling import read_dataset, run_labeling
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.test_pipeline_alerts import produce, second_topics, stored_alerts, wavy  # noqa: F401 (a fixture)
from tests.test_pipeline_labeling import FleetHistory, store_history

REPO_ROOT = Path(__file__).resolve().parents[1]
SETTINGS = PipelineSettings(allowed_lateness="30m")


@pytest.fixture(scope="session")
def engine_settings() -> EngineSettings:
    """The developer's installed engines (``precursor pipeline engines --install prism``); built here if missing."""
    state_dir = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    settings = EngineSettings(root=state_dir / "engines")
    install_prism(settings)
    return settings


@pytest.fixture(scope="session")
def flink_cluster(
    engine_settings: EngineSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalFlinkCluster]:
    """A local Flink cluster for the session, started and stopped by the command line, on free ports."""
    install_flink(engine_settings)
    rest, rpc, pool = free_ports(3)
    state = tmp_path_factory.mktemp("flink-state")
    ports = ["--state-dir", str(state), "--rest-port", str(rest), "--rpc-port", str(rpc)]
    ports += ["--worker-pool-port", str(pool)]
    env = {**os.environ, "PRECURSOR_ENGINE_ROOT": str(engine_settings.install_root)}

    def flink(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "precursor", "flink", *args, *ports]
        return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)

    started = flink("up", "--taskmanagers", "2")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"PRECURSOR_ENGINE_FLINK_MASTER=127.0.0.1:{rest}" in started.stdout
        status = flink("status")
        assert status.returncode == 0 and "2 task managers, 2 slots" in status.stdout, status.stdout + status.stderr
        from infra.maven_jars import pom_digest
        from pipelines.engines import FLINK_POM

        yield LocalFlinkCluster(
            state_dir=state,
            flink_jars=engine_settings.flink_jars_root / pom_digest(FLINK_POM),
            rest_port=rest,
            rpc_port=rpc,
            worker_pool_port=pool,
        )
    finally:
        stopped = flink("down")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture(scope="session")
def flink_settings(engine_settings: EngineSettings, flink_cluster: LocalFlinkCluster) -> EngineSettings:
    """Beam's Flink job server, submitting to the local cluster with parallelism 2 (one slot per task manager)."""
    return engine_settings.model_copy(
        update={
            "flink_master": flink_cluster.master,
            "flink_environment": "EXTERNAL",
            "flink_environment_config": f"{flink_cluster.host}:{flink_cluster.worker_pool_port}",
            "parallelism": 2,
        }
    )


@pytest.mark.parametrize("runner", [PRISM, pytest.param(FLINK, marks=pytest.mark.integration)])
def test_labeling_on_a_portable_engine_gives_the_same_dataset_as_the_local_runner(
    runner: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    settings: EngineSettings = request.getfixturevalue("flink_settings" if runner == FLINK else "engine_settings")
    history = FleetHistory(
        machines=5, hours=96, failures=[("pump-01", 30.5, "failure:bearing"), ("pump-03", 60, "failure")]
    )
    store = store_history(tmp_path / "store.duckdb", history.messages(wavy))

    local = run_labeling(store, tmp_path / "local", settings=SETTINGS, runner=LOCAL)
    portable = run_labeling(store, tmp_path / "portable", settings=SETTINGS, runner=runner, engine_settings=settings)

    assert local.outcomes == portable.outcomes and local.outcomes["bearing"] == 24 and local.outcomes["failure"] == 24
    assert (local.examples, local.pending) == (portable.examples, portable.pending)
    assert local.pending > 0
    assert read_dataset(tmp_path / "local").equals(read_dataset(tmp_path / "portable"))


@pytest.mark.integration
@pytest.mark.parametrize("runner", [PRISM, FLINK])
def test_ingest_with_alert_state_and_timers_on_a_portable_engine_matches_the_local_runner(
    runner: str,
    tmp_path: Path,
    kafka_settings: KafkaSettings,
    second_topics: KafkaSettings,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    settings: EngineSettings = request.getfixturevalue("flink_settings" if runner == FLINK else "engine_settings")
    messages = FleetHistory(machines=3, hours=40).messages(wavy)
    produce(kafka_settings, messages)
    produce(second_topics, messages)

    local = run_once(kafka_settings, tmp_path / "local.duckdb", pipeline_settings=SETTINGS)
    # On Flink in streaming mode: the alert stage once failed there on its timers, and streaming bundles across keys.
    portable = run_once(
        second_topics, tmp_path / "portable.duckdb", pipeline_settings=SETTINGS, runner=runner,
        engine_settings=settings, beam_args=["--streaming"] if runner == FLINK else None,
    )  # fmt: skip

    # A runner may process a bundle again (Beam promises a DoFn's effects at least once): a record written twice is
    # counted as already stored the second time, and the (edge_id, seq) key keeps one row. So the stores must hold the
    # same rows, and every record read be accounted for, new or already stored. (Under load, Prism once reported 40 of
    # 120 as newly stored; which of the two the other 80 were, the old assertion did not show.)
    both = f"local: {local}\nportable: {portable}"
    assert stored_predictions(tmp_path / "portable.duckdb") == stored_predictions(tmp_path / "local.duckdb"), both
    assert (local.read, local.stored, local.already_stored) == (len(messages), len(messages), 0), both
    assert (portable.read, portable.stored + portable.already_stored) == (local.read, local.stored), both
    assert portable.alerts_raised == local.alerts_raised > 0, both
    # Beam would keep the run's job server JVM until this process exits: one more per run of `--follow`.
    assert job_server_children() == []
    assert stored_alerts(tmp_path / "local.duckdb") == stored_alerts(tmp_path / "portable.duckdb")


def stored_predictions(store: Path) -> list[tuple[str, int, str, str, float]]:
    with connect(store, read_only=True) as con:
        return con.execute(
            "SELECT edge_id, seq, machine_id, strftime(window_end, '%Y-%m-%dT%H:%M'), max_risk FROM predictions"
            " ORDER BY ALL"
        ).fetchall()


def job_server_children() -> list[int]:
    """Processes of this one running a Flink job server (the launcher jar)."""
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = stat.read_text().rpartition(")")[2].split()[1]
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == me and FLINK_LAUNCHER.encode() in command:
            found.append(int(stat.parent.name))
    return found


def test_flink_runs_on_the_resolved_job_server_jar_with_an_embedded_cluster_by_default(tmp_path: Path) -> None:
    jar = tmp_path / "beam-runners-flink-1.20-job-server-2.77.0.jar"
    jar.write_bytes(b"PK")
    flink = engine(FLINK, ["--max_parallelism=4"], EngineSettings(root=tmp_path, flink_job_server_jar=jar))
    options = flink.options.get_all_options(drop_default=True)
    assert isinstance(flink.runner, FlinkRunner)
    assert flink.bundle_per_key and not engine(LOCAL).bundle_per_key  # so ingest regroups before its store writes
    assert options["flink_master"] == "[local]" and options["flink_job_server_jar"] == str(jar)
    assert options["environment_type"] == "LOOPBACK" and options["parallelism"] == 2
    assert options["max_parallelism"] == 4
    remote = engine(FLINK, [], EngineSettings(root=tmp_path, flink_job_server_jar=jar, flink_master="flink:8081"))
    assert remote.options.get_all_options()["flink_master"] == "flink:8081"


def test_an_engine_that_is_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="precursor pipeline engines --install flink"):
        engine(FLINK, [], EngineSettings(root=tmp_path))
    with pytest.raises(EngineError, match="precursor pipeline engines --install prism"):
        engine(PRISM, [], EngineSettings(root=tmp_path))
    with pytest.raises(EngineError, match=re.escape("flink_job_server_jar='/nowhere.jar': no such file")):
        engine(FLINK, [], EngineSettings(root=tmp_path, flink_job_server_jar=Path("/nowhere.jar")))


def test_the_worker_pool_keeps_apart_two_task_managers_that_give_their_workers_the_same_id() -> None:
    """Every task manager numbers its workers from 1-1: the pool must not stop one's worker for the other."""

    class Caller:
        def __init__(self, peer: str) -> None:
            self._peer = peer

        def peer(self) -> str:
            return self._peer

    pool = WorkerPool()
    start = beam_fn_api_pb2.StartWorkerRequest(worker_id="1-1")
    start.control_endpoint.url = "127.0.0.1:9"  # nothing answers: the worker waits, it does not matter here
    first, second = Caller("ipv4:127.0.0.1:40001"), Caller("ipv4:127.0.0.1:40002")
    assert not pool.StartWorker(start, first).error and not pool.StartWorker(start, second).error
    try:
        workers = dict(pool._workers)
        assert len(workers) == 2
        pool.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="1-1"), first)
        assert workers[(first.peer(), "1-1")].poll() is not None
        assert workers[(second.peer(), "1-1")].poll() is None
    finally:
        pool.stop_all()
