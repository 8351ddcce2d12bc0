"""``precursor query``: the common questions of the prediction store, as a table, JSON or CSV."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from precursor.common import FormatOption, JsonFlag, StoreOption, fail, since_time, store_path
from precursor.output import OutputFormat, show

query_app = typer.Typer(help="Ask the prediction store the common questions.", no_args_is_help=True)


def _ask(question: Callable[[Path], list[dict[str, Any]]], store: Path | None) -> list[dict[str, Any]]:
    from store.db import StoreBusy

    try:
        return question(store_path(store))
    except (FileNotFoundError, StoreBusy) as err:
        raise fail(str(err)) from None


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

    rows = _ask(lambda p: at_risk(p, limit=limit, since=since_time(since)), store)
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

    rows = _ask(lambda p: machine_history(p, machine_id, limit=limit, since=since_time(since)), store)
    if not rows:
        raise fail(f"no predictions for machine {machine_id!r} in {store_path(store)}")
    show(rows, OutputFormat.json if as_json else fmt, title=f"History of {machine_id}")


@query_app.command("edges")
def query_edges(store: StoreOption = None, fmt: FormatOption = OutputFormat.table, as_json: JsonFlag = False) -> None:
    """Predictions and machines per edge agent."""
    from store.queries import counts_per_edge

    show(_ask(counts_per_edge, store), OutputFormat.json if as_json else fmt, title="Edges")
