"""``precursor status``: the dataflow from reading to store in the terminal, with its bottleneck marked.

It reads what ``GET /api/v1/flow`` answers (:func:`pipelines.flow.flow_report`), straight from Kafka
(``PRECURSOR_KAFKA_*``) and the store, so it works without the API running.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from precursor.common import StoreOption, fail, store_path
from precursor.output import OutputFormat, show

if TYPE_CHECKING:
    from pipelines.flow import FlowReport

BOTTLENECK_MARK = "◀ bottleneck"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}/s"


def stage_rows(report: FlowReport) -> list[dict[str, Any]]:
    """One row per stage, in flow order, the bottleneck marked in its own column."""
    return [
        {
            "stage": s.title,
            "state": s.state,
            "in": _rate(s.input_per_s),
            "out": _rate(s.output_per_s),
            "backlog": "–" if s.backlog is None else f"{s.backlog:,}",
            "": BOTTLENECK_MARK if s.bottleneck else "",
            "why": s.reason,
        }
        for s in report.stages
    ]


def cost_rows(report: FlowReport) -> list[dict[str, Any]]:
    def per_1000(value: float | None, unit: str) -> str:
        return "–" if value is None else f"{value:,.3g} {unit}"

    return [
        {
            "part": c.part,
            "per 1,000": c.per,
            "CPU": per_1000(c.cpu_s_per_1000, "s"),
            "energy": per_1000(c.energy_j_per_1000, "J"),
            "from": c.cpu_s and f"{c.cpu_s:,.1f} CPU-s over {c.predictions:,}",
            "energy by": c.energy_source,
        }
        for c in report.costs
    ]


def status_command(
    store: StoreOption = None,
    window: Annotated[str | None, typer.Option("--window", help="rates over this long: 30s, 5m [default: 60s]")] = None,
    registry: Annotated[
        str | None,
        typer.Option("--registry", help="model registry (a folder or s3://bucket/prefix): adds what retraining costs"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the whole answer as JSON (what /api/v1/flow says)")] = False,
    check: Annotated[bool, typer.Option("--check", help="exit 1 when a stage is behind (for monitoring)")] = False,
) -> None:
    """The dataflow stage by stage (edge agents, Kafka, pipeline, store): rates, backlogs, the bottleneck by the
    rule it prints, and CPU and energy per 1,000 predictions."""
    from pydantic import ValidationError

    from infra.energy import EnergySettings
    from pipelines.flow import FlowSettings, flow_report
    from pipelines.settings import PipelineSettings
    from precursor.contracts.durations import parse_duration
    from precursor.contracts.object_store import as_location
    from precursor.contracts.settings import KafkaSettings

    try:
        overrides: dict[str, object] = {}
        if window is not None:
            overrides["window_s"] = parse_duration(window).total_seconds()
        settings = FlowSettings(**overrides)  # type: ignore[arg-type]
        kafka = KafkaSettings()
        energy = EnergySettings()
        pipeline = PipelineSettings()
    except (ValidationError, ValueError) as err:
        raise fail(err) from None
    report = flow_report(
        kafka,
        store_path(store),
        settings=settings,
        energy=energy,
        enrolled_edges=pipeline.enrolled_edges,
        model_registry=as_location(registry) if registry else pipeline.model_registry,
    )
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        typer.echo(report.verdict)
        show(stage_rows(report), OutputFormat.table, title=f"Dataflow, rates over the last {report.window_s:g} s")
        if report.costs:
            show(cost_rows(report), OutputFormat.table, title=f"Cost per 1,000 (energy {report.energy_model})")
        for problem in report.problems:
            typer.secho(f"not read: {problem}", fg=typer.colors.YELLOW, err=True)
        typer.echo(f"rule: {report.rule}")
    if check and report.bottleneck is not None:
        raise typer.Exit(1)
