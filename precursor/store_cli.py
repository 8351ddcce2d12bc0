"""``precursor store up|down|status``: a local PostgreSQL server for the prediction store, under ``<state>/postgres``.

``up`` makes the server once (``initdb``), starts it and prints the two settings that point every command, pipeline
and the API at it. The password stays in the server's ``pgpass`` file: what is printed names the file, never the
password. Any other server is used the same way, by its URL (``PRECURSOR_STORE_URL``), its password in
``PGPASSWORD`` or a ``PGPASSFILE``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from precursor.common import fail

if TYPE_CHECKING:
    from infra.postgres_server import LocalPostgres

store_app = typer.Typer(
    help="Run a local PostgreSQL server for the prediction store (DuckDB, a file, stays the default).",
    no_args_is_help=True,
)

StateDirOption = Annotated[Path | None, typer.Option("--state-dir", help="[default: PRECURSOR_STATE_DIR or .state]")]


def server(state_dir: Path | None) -> LocalPostgres:
    from infra.postgres_server import LocalPostgres
    from precursor.contracts.settings import PrecursorSettings

    return LocalPostgres((state_dir or PrecursorSettings().state_dir) / "postgres")


@store_app.command()
def up(
    state_dir: StateDirOption = None,
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 [default: the one it had, else a free one]")
    ] = None,
) -> None:
    """Make (once) and start the server and its database; print the settings that point Precursor at it."""
    from infra.maven_jars import MissingToolError
    from infra.postgres_server import PostgresServerError
    from precursor.store import connect

    chosen = server(state_dir)
    try:
        url = chosen.up(port=port, report=typer.echo)
    except (PostgresServerError, MissingToolError) as err:
        raise fail(err, 1) from None
    os.environ["PGPASSFILE"] = str(chosen.pgpass)  # this server's password, for the connection below
    with connect(url):  # a writer's first connection makes the tables: readers find a store at once
        pass
    typer.echo("use it as the prediction store with:")
    typer.echo(f"  export PRECURSOR_STORE_URL={url}")
    typer.echo(f"  export PGPASSFILE={chosen.pgpass}")


@store_app.command()
def down(state_dir: StateDirOption = None) -> None:
    """Stop the server (its data stays for the next `up`)."""
    from infra.postgres_server import PostgresServerError

    try:
        server(state_dir).down(report=typer.echo)
    except PostgresServerError as err:
        raise fail(err, 1) from None


@store_app.command()
def status(
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of lines")] = False,
) -> None:
    """Whether the server runs, on which port, and the store URL. Exits 1 unless it runs."""
    current = server(state_dir).status()
    fields = {
        "running": current.running,
        "port": current.port,
        "url": current.url,
        "pgpass": str(current.pgpass),
        "data": str(current.data_dir),
    }
    if as_json:
        typer.echo(json.dumps(fields, indent=2))
    else:
        width = max(len(k) for k in fields)
        for key, value in fields.items():
            shown = ("yes" if value else "no") if isinstance(value, bool) else ("-" if value is None else value)
            typer.echo(f"{key:<{width}}  {shown}")
    if not current.running:
        raise typer.Exit(1)
