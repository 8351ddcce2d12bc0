"""``precursor simulate``: write a simulated fleet in the generic formats and say what is in it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from simulator.config import DEFAULT_START, FleetConfig
from simulator.files import FORMATS, write_fleet
from simulator.physics import FAILURE_KINDS


def _config_error(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in err.errors(include_url=False)
    )


def simulate_command(
    out: Annotated[
        Path, typer.Option(help="Folder to write telemetry, events, machines and ground truth into.")
    ] = Path("simulated"),
    machines: Annotated[int, typer.Option(min=1, help="Number of machines in the fleet.")] = 10,
    days: Annotated[float, typer.Option(min=0.001, help="Simulated days.")] = 30.0,
    interval: Annotated[str, typer.Option(help="Time between readings of a machine: 30s, 5m, 1h.")] = "5m",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give identical files.")] = 0,
    kinds: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated failure kinds that can happen (default: all of {', '.join(FAILURE_KINDS)})."
        ),
    ] = None,
    format: Annotated[str, typer.Option("--format", help=f"File format: {' or '.join(FORMATS)}.")] = "csv",
    mtbf_days: Annotated[
        float, typer.Option(min=0.01, help="Mean days between failure-bound degradations per machine.")
    ] = 10.0,
    missing_rate: Annotated[float, typer.Option(min=0.0, max=0.99, help="Share of sensor values left blank.")] = 0.01,
    noise: Annotated[float, typer.Option(min=0.0, help="Multiplier on measurement noise.")] = 1.0,
    start: Annotated[
        str, typer.Option(help="Simulated time of the first reading (ISO 8601).")
    ] = DEFAULT_START.strftime("%Y-%m-%dT%H:%M:%SZ"),
) -> None:
    """Simulate a fleet of machines that degrade, raise error codes, get maintained and fail; write it to files."""
    if format not in FORMATS:
        raise typer.BadParameter(f"format={format!r} is not one of {', '.join(FORMATS)}", param_hint="--format")
    fields: dict[str, object] = {
        "machines": machines,
        "duration": timedelta(days=days),
        "interval": interval,
        "seed": seed,
        "mtbf": timedelta(days=mtbf_days),
        "missing_rate": missing_rate,
        "noise": noise,
        "start": start,
    }
    if kinds is not None:
        fields["failure_kinds"] = kinds
    try:
        config = FleetConfig.model_validate(fields)
    except ValidationError as err:
        raise typer.BadParameter(_config_error(err)) from None
    files = write_fleet(config, out, format=format)  # type: ignore[arg-type]  # checked against FORMATS above
    summary = files.summary
    failures = ", ".join(f"{kind} {count}" for kind, count in summary.failures_by_kind.items()) or "none"
    events = ", ".join(f"{kind} {count}" for kind, count in summary.events_by_type.items()) or "none"
    typer.echo(
        f"simulated {summary.machines} machines over {days:g} days every {interval}: "
        f"{summary.rows:,} readings in {summary.seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)"
    )
    typer.echo(f"failures: {failures}")
    typer.echo(f"events: {events}")
    typer.echo(f"written: {files.telemetry}, {files.events}, {files.machines}, {files.ground_truth}")
