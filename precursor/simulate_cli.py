"""``precursor simulate``: write a simulated fleet in the generic formats and say what is in it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from precursor.simulator.config import DEFAULT_START, FleetConfig
from precursor.simulator.files import FORMATS, write_fleet
from precursor.simulator.physics import FAILURE_KINDS
from precursor.simulator.profiles import PROFILES


def _config_error(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in err.errors(include_url=False)
    )


def _span(seconds: int) -> str:
    """``86400`` -> ``1d``, ``300`` -> ``5m``: the largest unit that divides it."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def simulate_command(
    out: Annotated[
        Path, typer.Option(help="Folder to write telemetry, events, machines and ground truth into.")
    ] = Path("simulated"),
    profile: Annotated[
        str | None,
        typer.Option(
            help=f"A kind of fleet: {', '.join(PROFILES)} (options given explicitly win over its preset; "
            "see precursor/simulator/profiles.py)."
        ),
    ] = None,
    machines: Annotated[int | None, typer.Option(min=1, help="Number of machines in the fleet. (default: 10)")] = None,
    days: Annotated[float, typer.Option(min=0.001, help="Simulated days.")] = 30.0,
    interval: Annotated[
        str | None,
        typer.Option(help="Time between readings of a machine: 30s, 5m, 1h. (default: the profile's, else 5m)"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give identical files.")] = 0,
    kinds: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated failure kinds that can happen (default: all of {', '.join(FAILURE_KINDS)})."
        ),
    ] = None,
    format: Annotated[str, typer.Option("--format", help=f"File format: {' or '.join(FORMATS)}.")] = "csv",
    mtbf_days: Annotated[
        float | None,
        typer.Option(
            min=0.01, help="Mean days between failure-bound degradations per machine. (default: the profile's, else 10)"
        ),
    ] = None,
    missing_rate: Annotated[
        float | None, typer.Option(min=0.0, max=0.99, help="Share of sensor values left blank. (default: 0.01)")
    ] = None,
    noise: Annotated[float | None, typer.Option(min=0.0, help="Multiplier on measurement noise. (default: 1)")] = None,
    start: Annotated[
        str, typer.Option(help="Simulated time of the first reading (ISO 8601).")
    ] = DEFAULT_START.strftime("%Y-%m-%dT%H:%M:%SZ"),
) -> None:
    """Simulate a fleet of machines that degrade, raise error codes, get maintained and fail; write it to files."""
    if format not in FORMATS:
        raise typer.BadParameter(f"format={format!r} is not one of {', '.join(FORMATS)}", param_hint="--format")
    given: dict[str, object | None] = {
        "profile": profile,
        "machines": machines,
        "duration": timedelta(days=days),
        "interval": interval,
        "seed": seed,
        "mtbf": timedelta(days=mtbf_days) if mtbf_days is not None else None,
        "missing_rate": missing_rate,
        "noise": noise,
        "start": start,
        "failure_kinds": kinds,
    }
    fields = {name: value for name, value in given.items() if value is not None}  # the rest: profile, else defaults
    try:
        config = FleetConfig.model_validate(fields)
    except ValidationError as err:
        raise typer.BadParameter(_config_error(err)) from None
    files = write_fleet(config, out, format=format)  # type: ignore[arg-type]  # checked against FORMATS above
    summary = files.summary
    failures = ", ".join(f"{kind} {count}" for kind, count in summary.failures_by_kind.items()) or "none"
    events = ", ".join(f"{kind} {count}" for kind, count in summary.events_by_type.items()) or "none"
    typer.echo(
        f"simulated {summary.machines} machines over {days:g} days every {_span(config.interval_s)}: "
        f"{summary.rows:,} readings in {summary.seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)"
    )
    typer.echo(f"failures: {failures}")
    typer.echo(f"events: {events}")
    typer.echo(f"written: {files.telemetry}, {files.events}, {files.machines}, {files.ground_truth}")
