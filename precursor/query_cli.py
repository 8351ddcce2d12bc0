"""``precursor query``: the common questions of the prediction store, as a table, JSON or CSV, and raw read-only SQL.

Time ranges are ``--since``/``--until``: a duration back from now (``6h``, ``7d``), ``now``, or a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from precursor.common import FormatOption, JsonFlag, StoreOption, fail, since_time, store_path
from precursor.output import OutputFormat, show

if TYPE_CHECKING:
    from precursor.store.queries import StoreReader

query_app = typer.Typer(
    help="Ask the prediction store the common questions, or any read-only SQL.", no_args_is_help=True
)

SinceOption = Annotated[str | None, typer.Option("--since", help="from: 6h, 7d (back from now), or a time")]
UntilOption = Annotated[str | None, typer.Option("--until", help="to: same forms as --since")]
LimitOption = Annotated[int, typer.Option("--limit", "-n", min=1, max=100_000, help="rows to show")]
OffsetOption = Annotated[int, typer.Option("--offset", min=0, help="rows to skip (for paging)")]
ThresholdOption = Annotated[
    float | None, typer.Option("--threshold", min=0.0, max=1.0, help="risk that counts as a warning [default: 0.7]")
]


AT_RISK_COLUMNS = (
    "machine_id",
    "max_risk",
    "threshold",
    "top_kind",
    "elevated_since",
    "open_alerts",
    "window_end",
    "model_version",
    "edge_id",
)
HISTORY_COLUMNS = ("window_end", "max_risk", "top_kind", "risk", "model_version", "edge_id", "seq")
QUALITY_COLUMNS = (
    "model_version",
    "bucket_start",
    "windows",
    "tp",
    "fp",
    "fn",
    "precision",
    "recall",
    "failures",
    "failures_caught",
    "mean_lead_time_h",
    "source",
)
FAILURE_COLUMNS = ("machine_id", "failed_at", "failure_kind", "warned_at", "lead_time_h", "peak_risk", "caught")


def _format(fmt: OutputFormat, as_json: bool) -> OutputFormat:
    return OutputFormat.json if as_json else fmt


def _until(until: str | None) -> datetime | None:
    from precursor.store.queries import parse_time_bound

    if until is None:
        return None
    try:
        return parse_time_bound(until, name="--until")
    except ValueError as err:
        raise fail(str(err)) from None


def _range(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    from precursor.store.queries import check_range

    start, end = since_time(since), _until(until)
    try:
        check_range(start, end)
    except ValueError as err:
        raise fail(str(err)) from None
    return start, end


@contextmanager
def _store(store: Path | None) -> Iterator[StoreReader]:
    from precursor.store.db import StoreBusy
    from precursor.store.queries import reading

    try:
        with reading(store_path(store)) as reader:
            yield reader
    except (FileNotFoundError, StoreBusy) as err:
        raise fail(str(err)) from None


def _ask(question: Callable[[StoreReader], Any], store: Path | None) -> Any:
    with _store(store) as reader:
        return question(reader)


def _unknown_machine(machine_id: str, store: Path | None) -> typer.Exit:
    return fail(f"unknown machine {machine_id!r}: no predictions or events for it in {store_path(store)}")


def _level(threshold: float | None) -> float:
    """The risk that counts as a warning: the one asked for, else the store's default."""
    from precursor.store.queries import DEFAULT_THRESHOLD

    return DEFAULT_THRESHOLD if threshold is None else threshold


def _cell(value: Any) -> Any:
    """Lists and nested rows as one readable cell (tables and CSV have no nesting)."""
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return "; ".join(" ".join(f"{k}={_short(v)}" for k, v in item.items()) for item in value)
        return ", ".join(str(v) for v in value)
    return value


def _short(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _unique(names: list[str]) -> list[str]:
    """Column names made unique (``a``, ``a_2``), so no column of a SELECT is lost in a row of named values."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def _print(
    rows: list[dict[str, Any]], fmt: OutputFormat, title: str, *, table_columns: tuple[str, ...] | None = None
) -> None:
    """JSON gets every field as it is; CSV every field flattened; a table the ``table_columns`` that fit a terminal."""
    if fmt is OutputFormat.json:
        show(rows, fmt, title=title)
        return
    if fmt is OutputFormat.table and table_columns:
        rows = [{k: row.get(k) for k in table_columns} for row in rows]
    show([{k: _cell(v) for k, v in row.items()} for row in rows], fmt, title=title)


def _alerts_cell(alerts: list[dict[str, Any]]) -> str:
    return ", ".join(f"{a['kind']} since {_short(a['raised_at'])}" for a in alerts)


def _versions_cell(versions: list[dict[str, Any]]) -> str:
    return ", ".join(f"{v['model_version']} on {v['machines']}" for v in versions)


@query_app.command("at-risk")
def query_at_risk(
    limit: LimitOption = 10,
    offset: OffsetOption = 0,
    since: Annotated[
        str | None, typer.Option("--since", help="only machines whose latest window ended after this (6h, 7d, a time)")
    ] = None,
    min_risk: Annotated[float | None, typer.Option("--min-risk", min=0.0, max=1.0)] = None,
    edge: Annotated[str | None, typer.Option("--edge", help="only machines of this edge")] = None,
    model_version: Annotated[str | None, typer.Option("--model-version")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="only machines whose top failure kind is this")] = None,
    threshold: ThresholdOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """The machines most at risk now: each machine's latest prediction, riskiest first, why, and since when. Each is
    judged at its model's alert threshold (as the pipeline alerts, PRECURSOR_PIPELINE_ALERT_*) unless --threshold."""
    from pipelines.settings import PipelineSettings

    rule = PipelineSettings().alert_rule
    start = since_time(since)
    page = _ask(
        lambda s: s.at_risk(
            limit=limit,
            offset=offset,
            since=start,
            min_risk=min_risk,
            edge_id=edge,
            model_version=model_version,
            kind=kind,
            threshold=threshold,
            rule=rule,
        ),
        store,
    )
    shown = f"{offset + 1}-{offset + len(page.rows)} of {page.total}" if page.rows else f"none of {page.total}"
    out = _format(fmt, as_json)
    rows = page.rows
    if out is OutputFormat.table:
        rows = [r | {"open_alerts": _alerts_cell(r["open_alerts"])} for r in rows]
    _print(rows, out, f"Machines most at risk ({shown})", table_columns=AT_RISK_COLUMNS)


@query_app.command("machine")
def query_machine(
    machine_id: Annotated[str, typer.Argument(help="the machine to show")],
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    since: SinceOption = None,
    until: UntilOption = None,
    threshold: ThresholdOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """One machine's history: its failures with lead times, then its predictions, newest first.

    CSV has one table: the predictions (use ``query failures --machine`` for the failures)."""
    start, end = _range(since, until)
    level = _level(threshold)
    with _store(store) as reader:
        summary = reader.machine_summary(machine_id)
        if summary is None:
            raise _unknown_machine(machine_id, store)
        failures = reader.failures(machine_id, threshold=level, since=start, until=end, limit=1000).rows
        history = reader.machine_history(machine_id, limit=limit, offset=offset, since=start, until=end)
    out = _format(fmt, as_json)
    if out is OutputFormat.json:
        typer.echo(
            json.dumps(
                {"machine": summary, "failures": failures, "predictions": history.rows, "total": history.total},
                default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v),
                indent=2,
            )
        )
        return
    if out is OutputFormat.table:
        latest = summary["latest"] or {}
        typer.echo(
            f"{machine_id}: {summary['predictions']} predictions from {_short(summary['first_window_end'])} "
            f"to {_short(summary['last_window_end'])}; latest risk {_short(latest.get('max_risk', ''))} "
            f"({latest.get('top_kind', '-')}); events {summary['events'] or 'none'}"
        )
        _print(
            [
                {k: f[k] for k in ("failed_at", "failure_kind", "warned_at", "lead_time_h", "peak_risk")}
                for f in failures
            ],
            out,
            f"Failures of {machine_id} (warning at risk >= {level:g})",
        )
    _print(
        history.rows,
        out,
        f"Predictions of {machine_id} ({len(history.rows)} of {history.total})",
        table_columns=HISTORY_COLUMNS,
    )


@query_app.command("failures")
def query_failures(
    machine: Annotated[str | None, typer.Option("--machine", "-m", help="only this machine")] = None,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    since: SinceOption = None,
    until: UntilOption = None,
    threshold: ThresholdOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """Failures, newest first, with when they were first warned of and the lead time that gave."""
    start, end = _range(since, until)
    with _store(store) as reader:
        if machine is not None and not reader.machine_exists(machine):
            raise _unknown_machine(machine, store)
        page = reader.failures(
            machine,
            threshold=_level(threshold),
            limit=limit,
            offset=offset,
            since=start,
            until=end,
        )
    _print(
        page.rows, _format(fmt, as_json), f"Failures ({len(page.rows)} of {page.total})", table_columns=FAILURE_COLUMNS
    )


@query_app.command("events")
def query_events(
    machine_id: Annotated[str, typer.Argument(help="the machine whose events to show")],
    kind: Annotated[list[str] | None, typer.Option("--kind", help="failure, maintenance, error, anomaly")] = None,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    since: SinceOption = None,
    until: UntilOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """One machine's events (failures, maintenance, error codes, anomalies), newest first."""
    start, end = _range(since, until)
    with _store(store) as reader:
        if not reader.machine_exists(machine_id):
            raise _unknown_machine(machine_id, store)
        page = reader.machine_events(machine_id, kinds=kind, limit=limit, offset=offset, since=start, until=end)
    _print(page.rows, _format(fmt, as_json), f"Events of {machine_id} ({len(page.rows)} of {page.total})")


@query_app.command("alerts")
def query_alerts(
    machine: Annotated[str | None, typer.Option("--machine", "-m")] = None,
    state: Annotated[str | None, typer.Option("--state", help="raised or cleared")] = None,
    kind: Annotated[str | None, typer.Option("--kind")] = None,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    since: SinceOption = None,
    until: UntilOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """Alerts raised and cleared by the pipelines, newest first."""
    if state is not None and state not in ("raised", "cleared"):
        raise fail(f"--state {state!r} must be 'raised' or 'cleared'")
    start, end = _range(since, until)
    page = _ask(
        lambda s: s.alerts(
            machine_id=machine, state=state, kind=kind, limit=limit, offset=offset, since=start, until=end
        ),
        store,
    )
    out = _format(fmt, as_json)
    rows = page.rows
    if out is OutputFormat.table:  # the reasons in words, as the machine page says them
        rows = [r | {"reasons": "; ".join(x["text"] for x in r["reasons"] or [])} for r in rows]
    _print(rows, out, f"Alerts ({len(page.rows)} of {page.total})")


@query_app.command("versions")
def query_versions(
    edge: Annotated[str | None, typer.Option("--edge")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """Model versions per edge: predictions, machines, first and last window of each."""
    start, end = _range(since, until)
    rows = _ask(lambda s: s.model_versions(edge_id=edge, since=start, until=end), store)
    _print(rows, _format(fmt, as_json), "Model versions per edge")


@query_app.command("rollout")
def query_rollout(store: StoreOption = None, fmt: FormatOption = OutputFormat.table, as_json: JsonFlag = False) -> None:
    """Per edge: which model its machines run, its newest heartbeat, and whether it runs the fleet's newest."""
    rows = _ask(lambda s: s.rollout(), store)
    out = _format(fmt, as_json)
    if out is not OutputFormat.json:
        rows = [
            {
                **{k: v for k, v in r.items() if k not in ("heartbeat", "identity")},
                "versions": _versions_cell(r["versions"]),
                "health": (r["heartbeat"] or {}).get("health"),
                "heartbeat_at": (r["heartbeat"] or {}).get("heartbeat_at"),
                "trust": r["identity"]["trust"],
                "flags": " ".join(r["identity"]["flags"]),
            }
            for r in rows
        ]
    _print(rows, out, "Model rollout per edge")


@query_app.command("quality")
def query_quality(
    bucket: Annotated[str, typer.Option("--bucket", help="period per row: 6h, 1d, 7d")] = "1d",
    model_version: Annotated[str | None, typer.Option("--model-version")] = None,
    kind: Annotated[
        str, typer.Option("--kind", help="failure kind, where the monitoring pipeline wrote metrics; failure = any")
    ] = "failure",
    threshold: ThresholdOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """Precision and recall per model version over time (the monitoring pipeline's metrics where it wrote any)."""
    from precursor.contracts.durations import parse_duration

    try:
        width = parse_duration(bucket)
    except ValueError as err:
        raise fail(f"--bucket: {err}") from None
    if width.total_seconds() < 3600:
        raise fail(f"--bucket {bucket!r} must be at least 1h")
    start, end = _range(since, until)
    rows = _ask(
        lambda s: s.quality(
            bucket=width,
            threshold=_level(threshold),
            model_version=model_version,
            kind=kind,
            since=start,
            until=end,
        ),
        store,
    )
    _print(rows, _format(fmt, as_json), "Quality per model version", table_columns=QUALITY_COLUMNS)


@query_app.command("edges")
def query_edges(store: StoreOption = None, fmt: FormatOption = OutputFormat.table, as_json: JsonFlag = False) -> None:
    """Predictions and machines per edge agent."""
    _print(_ask(lambda s: s.counts_per_edge(), store), _format(fmt, as_json), "Edges")


@query_app.command("sql")
def query_sql(
    statement: Annotated[str, typer.Argument(help="one SELECT (or WITH ... SELECT); '-' reads it from stdin")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=10_000)] = 1000,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, max=600.0, help="seconds before it is stopped")
    ] = 30.0,
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    as_json: JsonFlag = False,
) -> None:
    """Raw read-only SQL over the store. Anything that would write, or reach files or the network, is refused."""
    from precursor.store.queries import SqlRejected

    text = typer.get_text_stream("stdin").read() if statement == "-" else statement
    try:
        result = _ask(lambda s: s.sql(text, limit=limit, timeout_s=timeout), store)
    except SqlRejected as err:
        raise fail(str(err)) from None
    names = _unique(result.columns)
    rows = [dict(zip(names, row, strict=True)) for row in result.rows]
    _print(rows, _format(fmt, as_json), f"{len(rows)} rows" + (" (truncated)" if result.truncated else ""))
    if result.truncated:
        typer.secho(f"(stopped at --limit {limit} rows)", err=True, fg=typer.colors.YELLOW)
