"""``precursor kafka up|down|status``: the local broker from the command line.

Each option falls back to its ``PRECURSOR_LOCAL_KAFKA_*`` variable (``PRECURSOR_STATE_DIR`` for the state folder), then
to the default of :class:`~infra.kafka_broker.LocalKafka`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from infra.kafka_admin import TopicSetupError
from infra.kafka_broker import BrokerError, BrokerStatus, LocalKafka
from infra.kafka_cluster import ClusterStatus, LocalKafkaCluster
from infra.maven_jars import JarResolutionError, MissingToolError
from precursor.common import fail
from precursor.output import aligned

kafka_app = typer.Typer(
    help="Run a local single-node Kafka broker (KRaft, jars from Maven Central, no Docker) with Precursor's topics.",
    no_args_is_help=True,
)

StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="folder for data, logs and the pid file [default: .state]")
]
PortOption = Annotated[int | None, typer.Option("--port", help="client port [default: 9092]")]
ControllerPortOption = Annotated[
    int | None, typer.Option("--controller-port", help="KRaft controller port [default: 9093]")
]
BrokersOption = Annotated[
    int,
    typer.Option(
        "--brokers",
        min=1,
        max=9,
        help="nodes: 1 is a single broker; 3 is a cluster on ports PORT, PORT+2, PORT+4 (controllers one above each),"
        " topics replicated 3 times with min.insync.replicas=2",
    ),
]


def _problems(err: ValidationError) -> str:
    # Without the values given: the broker's settings hold its admin password.
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in err.errors())


def _given(**options: Any) -> dict[str, Any]:
    """The options given on the command line; one left at None takes the settings' variable or default."""
    return {name: value for name, value in options.items() if value is not None}


def _broker(state_dir: Path | None, port: int | None, controller_port: int | None, **more: Any) -> LocalKafka:
    try:
        return LocalKafka(**_given(state_dir=state_dir, port=port, controller_port=controller_port, **more))
    except ValidationError as err:
        raise fail(_problems(err)) from None


def _cluster(brokers: int, state_dir: Path | None, port: int | None, **more: Any) -> LocalKafkaCluster:
    # The state folder and topic prefix follow the single broker's settings (and their environment variables).
    single = _broker(state_dir, None, None)
    settings = {
        "brokers": brokers,
        "state_dir": single.state_dir,
        "host": single.host,
        "topic_prefix": single.topic_prefix,
        "lib_dir": single.jars_root,
        **_given(first_port=port, **more),
    }
    try:
        return LocalKafkaCluster(**settings)
    except ValidationError as err:
        raise fail(_problems(err)) from None


@kafka_app.command()
def up(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    controller_port: ControllerPortOption = None,
    partitions: Annotated[int | None, typer.Option(help="partitions per multi-partition topic [default: 6]")] = None,
    brokers: BrokersOption = 1,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the broker to answer")] = 60.0,
) -> None:
    """Start the broker (resolving its jars on first use) and create the topics; a no-op when it already runs."""
    if brokers > 1:
        cluster = _cluster(brokers, state_dir, port, partitions=partitions)
        try:
            cluster.up(timeout_s=max(timeout, 120.0), report=typer.echo)
        except (BrokerError, MissingToolError, JarResolutionError, TopicSetupError) as err:
            raise fail(err, 1) from None
        typer.echo(f"clients: PRECURSOR_KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap}")
        return
    broker = _broker(state_dir, port, controller_port, partitions=partitions)
    try:
        broker.up(timeout_s=timeout, report=typer.echo)
    except (BrokerError, MissingToolError, JarResolutionError, TopicSetupError) as err:
        raise fail(err, 1) from None


@kafka_app.command()
def down(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    controller_port: ControllerPortOption = None,
    brokers: BrokersOption = 1,
    timeout: Annotated[float, typer.Option(help="seconds to wait after SIGTERM before SIGKILL")] = 30.0,
) -> None:
    """Stop the broker this state folder started; other Kafka processes are left alone."""
    if brokers > 1:
        try:
            _cluster(brokers, state_dir, port).down(timeout_s=timeout, report=typer.echo)
        except BrokerError as err:
            raise fail(err, 1) from None
        return
    broker = _broker(state_dir, port, controller_port)
    try:
        broker.down(timeout_s=timeout, report=typer.echo)
    except BrokerError as err:
        raise fail(err, 1) from None


def _status_lines(status: BrokerStatus) -> list[str]:
    rows = [
        ("running", "yes" if status.running else "no"),
        ("answering", "yes" if status.reachable else "no"),
        ("pid", str(status.pid) if status.pid is not None else "-"),
        ("bootstrap", status.bootstrap),
        ("state dir", str(status.state_dir)),
        ("topics", ", ".join(status.topics) if status.topics else "-"),
    ]
    return aligned(rows)


def _cluster_lines(status: ClusterStatus) -> list[str]:
    rows = [
        ("running", f"{status.running} of {len(status.nodes)} nodes"),
        ("answering", "yes" if status.reachable else "no"),
        *((f"node {n.node_id}", f"{n.bootstrap} pid {n.pid if n.pid is not None else '-'}") for n in status.nodes),
        ("bootstrap", status.bootstrap),
        ("topics", ", ".join(status.topics) if status.topics else "-"),
    ]
    return aligned(rows)


@kafka_app.command()
def status(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    controller_port: ControllerPortOption = None,
    brokers: BrokersOption = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Whether the broker runs and answers, its pid, address and topics. Exits 1 when it is not running."""
    if brokers > 1:
        cluster = _cluster(brokers, state_dir, port).status()
        typer.echo(cluster.model_dump_json(indent=2) if as_json else "\n".join(_cluster_lines(cluster)))
        if cluster.running < len(cluster.nodes):
            raise typer.Exit(1)
        return
    current = _broker(state_dir, port, controller_port).status()
    if as_json:
        typer.echo(current.model_dump_json(indent=2))
    else:
        for line in _status_lines(current):
            typer.echo(line)
    if not current.running:
        raise typer.Exit(1)
