"""Printing rows as a table, JSON or CSV: the one way every ``precursor`` command shows results."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, dict):
        return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
    return "" if value is None else str(value)


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def show(rows: Sequence[dict[str, Any]], fmt: OutputFormat = OutputFormat.table, *, title: str | None = None) -> None:
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(list(rows), default=_jsonable, indent=2) + "\n")
        return
    columns = list(rows[0]) if rows else []
    if fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([json.dumps(v) if isinstance(v := row[c], dict) else _plain(v) for c in columns])
        return
    table = Table(title=title, show_lines=False)
    for c in columns:
        table.add_column(c, justify="right" if rows and isinstance(rows[0][c], int | float) else "left")
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    if not rows:
        table.add_column("(no rows)")
    Console(width=160).print(table)


def aligned(rows: Sequence[tuple[str, str]]) -> list[str]:
    """``name  value`` lines with the values in one column, for a status.

    >>> aligned([("pid", "7"), ("running", "yes")])
    ['pid      7', 'running  yes']
    """
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]
