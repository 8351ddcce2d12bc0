"""``precursor flink up|down|status``: a local Flink cluster (a JobManager, TaskManagers, an SDK worker pool).

The cluster runs from the Flink runner's jars that ``precursor pipeline engines --install flink`` resolved; ``up``
prints the ``PRECURSOR_ENGINE_*`` settings that send ``--runner flink`` jobs to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from precursor.common import fail
from precursor.output import aligned

if TYPE_CHECKING:
    from infra.flink_cluster import LocalFlinkCluster

flink_app = typer.Typer(
    help="Run a local Flink cluster (JobManager, TaskManagers, SDK worker pool) for `--runner flink` jobs.",
    no_args_is_help=True,
)

TaskManagersOption = Annotated[int, typer.Option("--taskmanagers", min=1, max=8, help="task manager processes")]
RestPortOption = Annotated[int, typer.Option("--rest-port", help="the JobManager's REST port (the flink master)")]
RpcPortOption = Annotated[int, typer.Option("--rpc-port", help="the JobManager's RPC port")]
PoolPortOption = Annotated[int, typer.Option("--worker-pool-port", help="the SDK worker pool's port")]
StateDirOption = Annotated[Path | None, typer.Option("--state-dir", help="[default: PRECURSOR_STATE_DIR or .state]")]


def cluster(
    state_dir: Path | None, taskmanagers: int, rest_port: int, rpc_port: int, worker_pool_port: int, slots: int = 1
) -> LocalFlinkCluster:
    """The cluster of these settings, its jars resolved (the runner's must be installed; the logging backend's are
    resolved here on first use)."""
    from infra.flink_cluster import FLINK_CLUSTER_LOGGING_POM, LocalFlinkCluster
    from infra.maven_jars import JarResolutionError, MissingToolError, pom_digest, resolve_runtime_jars
    from pipelines.engines import FLINK_POM, EngineSettings
    from precursor.contracts.settings import PrecursorSettings

    engines = EngineSettings()
    jars = engines.flink_jars_root / pom_digest(FLINK_POM)
    if not jars.is_dir():
        raise fail(f"no Flink jars in {jars}: run `precursor pipeline engines --install flink` once", 1)
    try:
        logging_jars = resolve_runtime_jars(FLINK_CLUSTER_LOGGING_POM, engines.flink_cluster_jars_root)
    except (JarResolutionError, MissingToolError) as err:
        raise fail(err, 1) from None
    return LocalFlinkCluster(
        state_dir=state_dir or PrecursorSettings().state_dir,
        flink_jars=jars,
        logging_jars=logging_jars,
        taskmanagers=taskmanagers,
        slots=slots,
        rest_port=rest_port,
        rpc_port=rpc_port,
        worker_pool_port=worker_pool_port,
    )


@flink_app.command()
def up(
    state_dir: StateDirOption = None,
    taskmanagers: TaskManagersOption = 2,
    slots: Annotated[int, typer.Option(min=1, max=8, help="slots per task manager")] = 1,
    rest_port: RestPortOption = 8081,
    rpc_port: RpcPortOption = 6123,
    worker_pool_port: PoolPortOption = 50000,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every task manager to register")] = 120.0,
) -> None:
    """Start the cluster (what of it is not running), wait until every task manager has registered."""
    from infra.flink_cluster import FlinkClusterError

    chosen = cluster(state_dir, taskmanagers, rest_port, rpc_port, worker_pool_port, slots)
    try:
        chosen.up(timeout_s=timeout, report=typer.echo)
    except FlinkClusterError as err:
        raise fail(err, 1) from None
    typer.echo("send `--runner flink` jobs to it with:")
    for key, value in chosen.engine_environment().items():
        typer.echo(f"  export {key}={value}")


@flink_app.command()
def down(
    state_dir: StateDirOption = None,
    taskmanagers: TaskManagersOption = 2,
    rest_port: RestPortOption = 8081,
    rpc_port: RpcPortOption = 6123,
    worker_pool_port: PoolPortOption = 50000,
) -> None:
    """Stop every process of the cluster this state folder started."""
    cluster(state_dir, taskmanagers, rest_port, rpc_port, worker_pool_port).down(report=typer.echo)


@flink_app.command()
def status(
    state_dir: StateDirOption = None,
    taskmanagers: TaskManagersOption = 2,
    rest_port: RestPortOption = 8081,
    rpc_port: RpcPortOption = 6123,
    worker_pool_port: PoolPortOption = 50000,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Which processes run, what the JobManager reports (task managers, slots, running jobs). Exits 1 unless all run."""
    current = cluster(state_dir, taskmanagers, rest_port, rpc_port, worker_pool_port).status()
    if as_json:
        typer.echo(current.model_dump_json(indent=2))
    else:
        pid = lambda value: "-" if value is None else str(value)  # noqa: E731
        rows = [
            ("running", "yes" if current.running else "no"),
            ("rest", current.rest),
            ("jobmanager", pid(current.jobmanager)),
            *((f"taskmanager {i}", pid(p)) for i, p in enumerate(current.taskmanagers, start=1)),
            ("worker pool", pid(current.worker_pool)),
            ("registered", f"{current.registered_taskmanagers} task managers, {current.slots_total} slots"),
            ("jobs running", str(current.jobs_running)),
        ]
        for line in aligned(rows):
            typer.echo(line)
    if not current.running:
        raise typer.Exit(1)
