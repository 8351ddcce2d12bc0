"""``precursor pipeline ...``: ingest with alerts, labeling, monitoring, and installing the engines.

A Typer sub-app; the main command line mounts it with ``app.add_typer(pipeline_app, name="pipeline")``. Heavy imports
(Beam) happen inside the commands.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from precursor.common import FormatOption, StoreOption, fail, store_path
from precursor.contracts.object_store import ObjectStoreError, as_location
from precursor.contracts.settings import KafkaSettings, PrecursorSettings
from precursor.output import show

pipeline_app = typer.Typer(help="Apache Beam pipelines: ingest and alerts, labeling, monitoring.", no_args_is_help=True)

RunnerOption = Annotated[
    str,
    typer.Option(
        "--runner", help="'local' (in-process), 'prism' (Beam's portable runner), 'flink', or a Beam runner name"
    ),
]
BeamArgOption = Annotated[
    list[str] | None,
    typer.Option("--beam-arg", help="extra Beam pipeline option, e.g. --beam-arg=--flink_master=host:8081"),
]
DatasetOption = Annotated[
    str | None,
    typer.Option(
        "--dataset",
        help="labeled dataset: a folder, or an object store URL such as s3://bucket/labeled (credentials from "
        "PRECURSOR_S3_* or AWS_*) [default: <state>/datasets/labeled]",
    ),
]


def dataset_path(dataset: str | Path | None) -> Path | str:
    """The dataset option as a location: a local ``Path``, or a URL kept as it was written."""
    return as_location(str(dataset)) if dataset else PrecursorSettings().state_dir / "datasets" / "labeled"


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
    runner: RunnerOption = "local",
    beam_arg: BeamArgOption = None,
) -> None:
    """Kafka predictions and events -> validate -> dead-letter -> drop duplicates -> store, and alerts."""
    from infra.kafka_admin import BrokerUnreachable, check_reachable
    from pipelines.engines import EngineError
    from pipelines.run import RunReport, run_once
    from pipelines.run import follow as follow_topics
    from precursor.contracts.enrollment import EnrollmentError

    settings = KafkaSettings()
    try:
        check_reachable(settings.servers)
    except BrokerUnreachable as err:
        raise fail(str(err)) from None
    path = store_path(store)
    kwargs = {"runner": runner, "beam_args": beam_arg or [], "from_beginning": from_beginning}

    def say(r: RunReport) -> None:
        typer.echo(
            f"pipeline: read {r.read}, stored {r.stored}, already stored {r.already_stored}, "
            f"duplicates dropped {r.duplicates}, dead-lettered {r.dead_lettered}, too late {r.too_late}, "
            f"alerts raised {r.alerts_raised}, cleared {r.alerts_cleared} "
            f"in {r.seconds:.1f} s -> {path}"
        )
        if r.telemetry_read:
            typer.echo(
                f"pipeline: telemetry summaries read {r.telemetry_read}, sensor rows stored {r.telemetry_rows_stored}, "
                f"dead-lettered {r.telemetry_dead_lettered}"
            )

    def said_failed(err: Exception, in_a_row: int) -> None:
        typer.echo(f"pipeline: run failed ({in_a_row} in a row), retrying from the stored offsets: {err}", err=True)

    try:
        if follow:
            total = follow_topics(
                settings,
                path,
                idle_exit_s=idle_exit,
                on_report=say,
                on_failure=said_failed,
                give_up_on=(EngineError, EnrollmentError, FileNotFoundError),
                **kwargs,  # type: ignore[arg-type]
            )
            say(total)
        else:
            say(run_once(settings, path, **kwargs))  # type: ignore[arg-type]
    # All but the first: a bad edge-trust setting (the enrolled-edges file, the model registry and its store).
    except (EngineError, EnrollmentError, FileNotFoundError, ObjectStoreError) as err:
        raise fail(str(err)) from None


@pipeline_app.command("label")
def pipeline_label(
    store: StoreOption = None,
    dataset: DatasetOption = None,
    runner: RunnerOption = "local",
    beam_arg: BeamArgOption = None,
) -> None:
    """Join stored predictions with the failures reported later into the Parquet training dataset."""
    from pipelines.engines import EngineError
    from pipelines.labeling import run_labeling

    folder = dataset_path(dataset)
    try:
        r = run_labeling(store_path(store), folder, runner=runner, beam_args=beam_arg or [])
    except (EngineError, FileNotFoundError, ObjectStoreError) as err:
        raise fail(str(err)) from None
    outcomes = ", ".join(f"{k} {v}" for k, v in r.outcomes.items()) or "none"
    typer.echo(
        f"labeling: {r.examples} examples ({outcomes}), {r.pending} pending, {len(r.days)} days "
        f"({len(r.days_rewritten)} rewritten) in {r.seconds:.1f} s -> {folder}"
    )


@pipeline_app.command("monitor")
def pipeline_monitor(
    store: StoreOption = None,
    dataset: DatasetOption = None,
    reference: Annotated[
        Path | None, typer.Option("--reference", help="drift reference histograms (JSON) from the training set")
    ] = None,
    kind: Annotated[str, typer.Option("--kind", help="failure kind to show ('failure' is any kind)")] = "failure",
    fmt: FormatOption = "table",  # type: ignore[assignment]
    runner: RunnerOption = "local",
    beam_arg: BeamArgOption = None,
) -> None:
    """Precision, recall and lead time per model version over sliding windows, and drift; into the store."""
    from pipelines.drift import DriftReference
    from pipelines.engines import EngineError
    from pipelines.monitoring import run_monitoring

    try:
        ref = DriftReference.load(reference) if reference else None
        r = run_monitoring(
            store_path(store), dataset_path(dataset), reference=ref, runner=runner, beam_args=beam_arg or []
        )
    except (EngineError, FileNotFoundError, ValueError, ObjectStoreError) as err:
        raise fail(str(err)) from None
    columns = ("model_version", "window_start", "window_end", "examples", "precision", "recall", "failures",
               "failures_caught", "mean_lead_time_h")  # fmt: skip
    show([{c: asdict(m)[c] for c in columns} for m in r.series(kind)], fmt, title=f"quality: {kind}")
    events = [asdict(d) for d in r.drift_events]
    if events:
        show(events, fmt, title="drift events")
    typer.echo(f"monitoring: {len(r.metrics)} window metrics, {len(r.drift_events)} drift events in {r.seconds:.1f} s")


@pipeline_app.command("engines")
def pipeline_engines(
    install: Annotated[
        list[str] | None, typer.Option("--install", help="install an engine's parts: 'prism' and/or 'flink'")
    ] = None,
) -> None:
    """Show the engines' installed parts, or install them (setup time: nothing is downloaded when pipelines run)."""
    from infra.maven_jars import JarResolutionError, MissingToolError
    from pipelines.engines import FLINK, PRISM, EngineError, EngineSettings, install_flink, install_prism

    settings = EngineSettings()
    for name in install or []:
        if name not in (PRISM, FLINK):
            raise fail(f"--install {name!r}: choose 'prism' or 'flink'")
        try:
            path = (
                install_prism(settings, report=typer.echo)
                if name == PRISM
                else install_flink(settings, report=typer.echo)
            )
        except (EngineError, MissingToolError, JarResolutionError) as err:
            raise fail(str(err)) from None
        typer.echo(f"{name}: {path}")
    if not install:
        typer.echo("local: in-process (always available)")
        typer.echo(
            f"prism: {settings.prism_path} ({'installed' if settings.prism_path.is_file() else 'not installed'})"
        )
        try:
            typer.echo(f"flink: {settings.flink_jar()}")
        except EngineError as err:
            typer.echo(f"flink: {err}")
