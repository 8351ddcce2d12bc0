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


def _broker(state_dir: Path | None, port: int | None, controller_port: int | None, **more: Any) -> LocalKafka:
    given = {"state_dir": state_dir, "port": port, "controller_port": controller_port, **more}
    try:
        return LocalKafka(**{name: value for name, value in given.items() if value is not None})
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in err.errors())
        raise fail(problems) from None


@kafka_app.command()
def up(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    controller_port: ControllerPortOption = None,
    partitions: Annotated[int | None, typer.Option(help="partitions per multi-partition topic [default: 6]")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the broker to answer")] = 60.0,
) -> None:
    """Start the broker (resolving its jars on first use) and create the topics; a no-op when it already runs."""
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
    timeout: Annotated[float, typer.Option(help="seconds to wait after SIGTERM before SIGKILL")] = 30.0,
) -> None:
    """Stop the broker this state folder started; other Kafka processes are left alone."""
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


@kafka_app.command()
def status(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    controller_port: ControllerPortOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Whether the broker runs and answers, its pid, address and topics. Exits 1 when it is not running."""
    current = _broker(state_dir, port, controller_port).status()
    if as_json:
        typer.echo(current.model_dump_json(indent=2))
    else:
        for line in _status_lines(current):
            typer.echo(line)
    if not current.running:
        raise typer.Exit(1)
