"""``precursor``: one command line for every side of the system.

Heavy imports (Beam, torch, onnxruntime) happen inside the commands that need them, so ``precursor --help`` is quick
and the edge install never loads the cloud stack.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from precursor.common import fail
from precursor.explain_cli import explain_command
from precursor.flink_cli import flink_app
from precursor.flows_cli import flows_app
from precursor.kafka_cli import kafka_app
from precursor.keys_cli import keys_command
from precursor.models_cli import evaluate_command, train_command
from precursor.objects_cli import objects_app
from precursor.pipeline_cli import pipeline_app
from precursor.query_cli import query_app
from precursor.serve_cli import serve_command
from precursor.simulate_cli import simulate_command
from precursor.status_cli import status_command
from precursor.store_cli import store_app

app = typer.Typer(
    help="Precursor: predict machine failures at the edge, learn from what really happened.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
edge_app = typer.Typer(help="The edge agent daemon.", no_args_is_help=True)
app.add_typer(kafka_app, name="kafka")
app.add_typer(flink_app, name="flink")
app.add_typer(edge_app, name="edge")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(query_app, name="query")
app.add_typer(flows_app, name="flows")
app.add_typer(objects_app, name="objects")
app.add_typer(store_app, name="store")
app.command("simulate")(simulate_command)
app.command("keys")(keys_command)
app.command("train")(train_command)
app.command("evaluate")(evaluate_command)
app.command("explain")(explain_command)
app.command("serve")(serve_command)
app.command("status")(status_command)


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log debug detail")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Beam and kafka-python are chatty: kafka-python warns about its own event loop timing, and Beam's GCP module
    # warns at import that BigQuery's client is missing (we never use it). Real errors still show.
    logging.getLogger("kafka").setLevel(logging.DEBUG if verbose else logging.ERROR)
    logging.getLogger("apache_beam").setLevel(logging.DEBUG if verbose else logging.WARNING)
    # A pipeline step that raises is logged by Beam's DoFn runner, traceback and all, before the same exception reaches
    # the command, which reports it as one line (or with its traceback, if it is not one the command knows).
    logging.getLogger("apache_beam.runners.common").setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    # Libraries that log through the root logger (ONNX Runtime's quantizer, Beam's GCP import) only speak up for
    # warnings; our own modules log under their names at INFO.
    for handler in logging.getLogger().handlers:
        handler.addFilter(
            lambda r: r.name != "root" or (r.levelno >= logging.WARNING and "apitools not found" not in r.getMessage())
        )


@edge_app.command("run")
def edge_run(
    config: Annotated[Path, typer.Option("--config", "-c", help="edge agent YAML config")],
) -> None:
    """Run an edge agent: read its sources, score every window, publish predictions and events to Kafka."""
    from edge_agent.config import ConfigError
    from edge_agent.daemon import SourceFailure, run_agent

    try:
        stats = run_agent(config)
    except ConfigError as err:
        raise fail(str(err)) from None
    except SourceFailure as err:  # status 1, not fail()'s 2: a restart continues from the committed positions
        raise fail(err, 1) from None
    typer.echo(
        f"edge agent done: {stats.readings} readings, {stats.windows} windows, {stats.predictions} predictions, "
        f"{stats.events} events, {stats.quarantined} quarantined"
    )


@edge_app.command("enroll")
def edge_enroll(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="edge agent YAML config: its edge_id and state_dir")
    ] = None,
    edge_id: Annotated[str | None, typer.Option("--edge-id", help="the edge's id, instead of --config")] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="the edge's state dir, with --edge-id")] = None,
) -> None:
    """Give this edge its own ed25519 key pair (in STATE_DIR/identity, private key mode 0600) and print the line that
    enrolls it. Add the line to the fleet's enrolled-edges file (PRECURSOR_PIPELINE_ENROLLED_EDGES): the pipeline then
    verifies the edge's signed heartbeats. An edge that has a key keeps it; the line is printed again."""
    from pydantic import TypeAdapter, ValidationError

    from edge_agent.config import ConfigError, EdgeConfig
    from edge_agent.identity import enroll
    from precursor.contracts.messages import Identifier

    if config is not None:
        if edge_id is not None or state_dir is not None:
            raise fail("give --config, or --edge-id with --state-dir, not both")
        try:
            loaded = EdgeConfig.load(config)
        except ConfigError as err:
            raise fail(str(err)) from None
        edge_id, state_dir = loaded.edge_id, loaded.state_dir
    elif edge_id is None or state_dir is None:
        raise fail("give --config FILE, or both --edge-id and --state-dir")
    try:  # the rule every message's edge_id meets, checked before a key is made for an id no heartbeat can carry
        TypeAdapter(Identifier).validate_python(edge_id)
    except ValidationError:
        raise fail(f"edge_id {edge_id!r} must be 1-128 letters, digits, '_', '.', ':' or '-'") from None
    try:
        enrollment = enroll(state_dir, edge_id)
    except (OSError, ValueError) as err:
        raise fail(str(err)) from None
    said = "made a new key pair" if enrollment.created else "already had its key pair; kept it"
    typer.echo(f"edge {edge_id} {said}: key_id {enrollment.key_id} ({enrollment.private_key_path})", err=True)
    typer.echo("add this line to the fleet's enrolled-edges file:", err=True)
    typer.echo(enrollment.line)


@app.command("demo")
def demo(
    machines: Annotated[int, typer.Option(help="simulated machines")] = 40,
    days: Annotated[float, typer.Option(help="simulated days of telemetry")] = 14.0,
    seed: Annotated[int, typer.Option(help="simulator seed")] = 7,
    model: Annotated[
        str, typer.Option(help="what the edge agents run: lm (trained on simulated history first) or drift-zscore")
    ] = "lm",
) -> None:
    """End to end on this machine: history -> signed int8 LM; simulated fleet -> edge agents -> Kafka -> Beam ->
    store -> the at-risk table."""
    from precursor.demo import run_demo

    if model not in ("lm", "drift-zscore"):
        raise typer.BadParameter(f"{model!r}: choose lm or drift-zscore", param_hint="--model")
    run_demo(machines=machines, days=days, seed=seed, model=model)


def main() -> None:  # pragma: no cover - the console script
    app()
