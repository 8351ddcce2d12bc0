"""``precursor``: one command line for every side of the system.

Heavy imports (Beam, torch, onnxruntime) happen inside the commands that need them, so ``precursor --help`` is quick
and the edge install never loads the cloud stack.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from contracts.durations import parse_duration
from contracts.settings import KafkaSettings, PrecursorSettings
from precursor.output import OutputFormat, show

app = typer.Typer(
    help="Precursor: predict machine failures at the edge, learn from what really happened.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
edge_app = typer.Typer(help="The edge agent daemon.", no_args_is_help=True)
pipeline_app = typer.Typer(help="Apache Beam pipelines over the Kafka topics.", no_args_is_help=True)
query_app = typer.Typer(help="Ask the prediction store the common questions.", no_args_is_help=True)
app.add_typer(edge_app, name="edge")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(query_app, name="query")

StoreOption = Annotated[
    Path | None, typer.Option("--store", help="prediction store file [default: <state>/store/predictions.duckdb]")
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table, json or csv")]
JsonFlag = Annotated[bool, typer.Option("--json", help="same as --format json")]


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _store(store: Path | None) -> Path:
    return store or PrecursorSettings().store_path


def _since(since: str | None) -> datetime | None:
    if since is None:
        return None
    try:
        return datetime.now(UTC) - parse_duration(since)
    except ValueError:
        pass
    try:
        from contracts.formats import parse_timestamp

        return parse_timestamp(since)
    except ValueError:
        raise _fail(f"--since {since!r} is neither a duration (6h, 7d) nor a time (2026-01-01T00:00Z)") from None


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log debug detail")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Beam and kafka-python are chatty at INFO; their warnings still show.
    for name in ("kafka", "apache_beam"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


@edge_app.command("run")
def edge_run(
    config: Annotated[Path, typer.Option("--config", "-c", help="edge agent YAML config")],
) -> None:
    """Run an edge agent: read its sources, score every window, publish predictions and events to Kafka."""
    from edge_agent.config import ConfigError
    from edge_agent.daemon import run_agent
    from edge_agent.publisher import BrokerUnreachable

    try:
        stats = run_agent(config)
    except (ConfigError, BrokerUnreachable) as err:
        raise _fail(str(err)) from None
    typer.echo(
        f"edge agent done: {stats.readings} readings, {stats.windows} windows, {stats.predictions} predictions, "
        f"{stats.events} events, {stats.quarantined} quarantined"
    )


@pipeline_app.command("run")
def pipeline_run(
    store: StoreOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="keep running, ingesting new records as they arrive")
    ] = False,
    idle_exit: Annotated[
        float | None, typer.Option("--idle-exit", help="with --follow: stop after this many seconds with nothing new")
    ] = None,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="re-read every retained record (stored rows are not doubled)")
    ] = False,
    runner: Annotated[
        str, typer.Option("--runner", help="'local' (in-process FnApiRunner) or a Beam runner name, e.g. FlinkRunner")
    ] = "local",
    beam_arg: Annotated[
        list[str] | None, typer.Option("--beam-arg", help="extra Beam pipeline option, e.g. --flink_master=host:8081")
    ] = None,
) -> None:
    """Kafka predictions and events -> validate -> dead-letter -> drop duplicates -> prediction store."""
    from edge_agent.publisher import BrokerUnreachable, check_reachable
    from pipelines.run import RunReport, run_once
    from pipelines.run import follow as follow_topics

    settings = KafkaSettings()
    try:
        check_reachable(settings.servers)
    except BrokerUnreachable as err:
        raise _fail(str(err)) from None
    path = _store(store)
    kwargs = {"runner": runner, "beam_args": beam_arg or [], "from_beginning": from_beginning}

    def say(r: RunReport) -> None:
        typer.echo(
            f"pipeline: read {r.read}, stored {r.stored}, already stored {r.already_stored}, "
            f"duplicates dropped {r.duplicates}, dead-lettered {r.dead_lettered} in {r.seconds:.1f} s -> {path}"
        )

    if follow:
        total = follow_topics(settings, path, idle_exit_s=idle_exit, on_report=say, **kwargs)  # type: ignore[arg-type]
        say(total)
    else:
        say(run_once(settings, path, **kwargs))  # type: ignore[arg-type]


@query_app.command("at-risk")
def query_at_risk(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=10_000)] = 10,
    since: Annotated[
        str | None, typer.Option("--since", help="only windows ending after this (6h, 7d or a time)")
    ] = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """The machines most at risk now: each machine's latest prediction, riskiest first."""
    from store.queries import at_risk

    rows = _query(lambda p: at_risk(p, limit=limit, since=_since(since)), store)
    show(rows, OutputFormat.json if as_json else fmt, title="Machines most at risk")


@query_app.command("machine")
def query_machine(
    machine_id: Annotated[str, typer.Argument(help="the machine to show")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=100_000)] = 50,
    since: Annotated[str | None, typer.Option("--since")] = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """One machine's prediction history, newest first."""
    from store.queries import machine_history

    rows = _query(lambda p: machine_history(p, machine_id, limit=limit, since=_since(since)), store)
    if not rows:
        raise _fail(f"no predictions for machine {machine_id!r} in {_store(store)}")
    show(rows, OutputFormat.json if as_json else fmt, title=f"History of {machine_id}")


@query_app.command("edges")
def query_edges(store: StoreOption = None, fmt: FormatOption = OutputFormat.table, as_json: JsonFlag = False) -> None:
    """Predictions and machines per edge agent."""
    from store.queries import counts_per_edge

    show(_query(counts_per_edge, store), OutputFormat.json if as_json else fmt, title="Edges")


def _query(ask, store: Path | None):  # type: ignore[no-untyped-def]
    from store.db import StoreBusy

    try:
        return ask(_store(store))
    except (FileNotFoundError, StoreBusy) as err:
        raise _fail(str(err)) from None


@app.command("demo")
def demo(
    machines: Annotated[int, typer.Option(help="simulated machines")] = 40,
    days: Annotated[float, typer.Option(help="simulated days of telemetry")] = 14.0,
    seed: Annotated[int, typer.Option(help="simulator seed")] = 7,
) -> None:
    """End to end on this machine: simulated fleet -> edge agents -> Kafka -> Beam -> store -> the at-risk table."""
    from precursor.demo import run_demo

    run_demo(machines=machines, days=days, seed=seed)


def main() -> None:  # pragma: no cover - the console script
    app()
