"""Options and helpers that several ``precursor`` commands share."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from precursor.contracts.durations import parse_duration
from precursor.contracts.formats import parse_timestamp
from precursor.contracts.settings import PrecursorSettings
from precursor.output import OutputFormat

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="prediction store file or postgresql:// URL [default: PRECURSOR_STORE_URL, else "
        "<state>/store/predictions.duckdb]",
    ),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table, json or csv")]
JsonFlag = Annotated[bool, typer.Option("--json", help="same as --format json")]


def fail(message: object, code: int = 2) -> typer.Exit:
    """Print a one-line error (no traceback) and return the exit to raise.

    The status is 2 for input the command refuses (a bad option or setting) and 1 for a failure while it ran (a broker
    that did not start, a model that did not train): scripts tell "fix the call" from "try again".
    """
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def store_path(store: str | Path | None) -> Path | str:
    """The store a command reads or writes: ``--store`` (a file, or a PostgreSQL URL kept as it is), else the
    settings'."""
    if store is None:
        return PrecursorSettings().store_path
    return PrecursorSettings(store=store, store_url=None).store_path


def since_time(since: str | None) -> datetime | None:
    """``--since`` as a duration back from now (``6h``, ``7d``) or as a time (``2026-01-01T00:00Z``)."""
    if since is None:
        return None
    try:
        return datetime.now(UTC) - parse_duration(since)
    except ValueError:
        pass
    try:
        return parse_timestamp(since)
    except ValueError:
        raise fail(f"--since {since!r} is neither a duration (6h, 7d) nor a time (2026-01-01T00:00Z)") from None
