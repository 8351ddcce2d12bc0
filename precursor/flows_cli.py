"""``precursor flows``: run the flows now, serve them on cron schedules, and manage the local Prefect server.

    precursor flows server up|down|status     the local Prefect server (background process, SQLite, offline)
    precursor flows serve                     deployments with cron schedules, served against that server
    precursor flows run retrain               one retrain now
    precursor flows run drift-check           one drift check now (it may start a retrain)

Flow settings come from ``PRECURSOR_RETRAIN_*`` and ``PRECURSOR_DRIFT_*`` variables (see :mod:`flows.settings`).
``run`` reports to the local server when it runs, so the run shows in its dashboard; otherwise Prefect runs the
flow against a temporary in-process server.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from infra.prefect_server import OFFLINE_ENVIRONMENT, LocalPrefectServer, PrefectServerError, PrefectServerStatus
from precursor.common import fail
from precursor.contracts.object_store import ObjectStoreError, filesystem, is_url
from precursor.output import aligned

if TYPE_CHECKING:
    from flows.settings import RetrainSettings

flows_app = typer.Typer(
    help="Prefect flows: retrain on evidence, check for drift, serve both on schedules.", no_args_is_help=True
)
server_app = typer.Typer(help="The local Prefect server, run in the background.", no_args_is_help=True)
run_app = typer.Typer(help="Run one flow now.", no_args_is_help=True)
flows_app.add_typer(server_app, name="server")
flows_app.add_typer(run_app, name="run")

StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="folder of the server's database, log and pid [default: .state]")
]
PortOption = Annotated[int | None, typer.Option("--port", help="the local server's port [default: 4200]")]


def _validation_problems(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'settings'}={e.get('input')!r:.60}: {e['msg']}" for e in err.errors()
    )


S = TypeVar("S")


def _settings_from_environment(factory: Callable[[], S]) -> S:
    """Settings read from ``PRECURSOR_*`` variables, or exit 2 naming what is wrong (a bad value, or a variable whose
    JSON does not parse) instead of a traceback."""
    try:
        return factory()
    except ValidationError as err:
        raise fail(_validation_problems(err)) from None
    except SettingsError as err:
        raise fail(f"{err}: is the variable's JSON well formed?") from None


def _server(state_dir: Path | None, port: int | None, **more: Any) -> LocalPrefectServer:
    given = {"state_dir": state_dir, "port": port, **more}
    try:
        return LocalPrefectServer(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as err:
        raise fail(_validation_problems(err)) from None


def _offline_environment(server: LocalPrefectServer) -> None:
    """No analytics, and Prefect's own files in the project's state folder unless ``PREFECT_HOME`` says otherwise.

    Called before Prefect is imported: its settings are read from the environment once, at import.
    """
    for key, value in {**OFFLINE_ENVIRONMENT, "PREFECT_HOME": str(server.home)}.items():
        os.environ.setdefault(key, value)
    # Prefect makes its home one level deep at most: in a state folder not made yet, its database could not be
    # opened, and a run without a server retried a temporary one for minutes, with a traceback each time.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)


# --- server --------------------------------------------------------------------------------------------------------


@server_app.command("up")
def server_up(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    ui: Annotated[bool, typer.Option("--ui/--no-ui", help="serve the dashboard too")] = True,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the server to answer")] = 120.0,
) -> None:
    """Start the local Prefect server in the background; a no-op when it already runs."""
    server = _server(state_dir, port, ui=ui)
    try:
        server.up(timeout_s=timeout, report=typer.echo)
    except PrefectServerError as err:
        raise fail(err, 1) from None
    typer.echo(f"clients: export PREFECT_API_URL={server.api_url}")


@server_app.command("down")
def server_down(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait after SIGTERM before SIGKILL")] = 30.0,
) -> None:
    """Stop the Prefect server this state folder started; other processes are left alone."""
    try:
        _server(state_dir, port).down(timeout_s=timeout, report=typer.echo)
    except PrefectServerError as err:
        raise fail(err, 1) from None


def _status_lines(status: PrefectServerStatus) -> list[str]:
    rows = [
        ("running", "yes" if status.running else "no"),
        ("healthy", "yes" if status.healthy else "no"),
        ("pid", str(status.pid) if status.pid is not None else "-"),
        ("api", status.api_url),
        ("home", str(status.home)),
    ]
    return aligned(rows)


@server_app.command("status")
def server_status(
    state_dir: StateDirOption = None,
    port: PortOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Whether the local server runs and answers. Exits 1 when it is not running."""
    current = _server(state_dir, port).status()
    if as_json:
        typer.echo(current.model_dump_json(indent=2))
    else:
        for line in _status_lines(current):
            typer.echo(line)
    if not current.running:
        raise typer.Exit(1)


# --- serve ---------------------------------------------------------------------------------------------------------


@flows_app.command("serve")
def serve_command(
    retrain_cron: Annotated[
        str, typer.Option(help="when retrain runs: cron, five fields, or six with seconds last")
    ] = "0 3 * * *",
    drift_check_cron: Annotated[str, typer.Option(help="when drift-check runs (cron)")] = "0 * * * *",
    no_drift_check: Annotated[bool, typer.Option("--no-drift-check", help="serve retrain only")] = False,
    timezone: Annotated[str, typer.Option(help="time zone of the cron schedules")] = "UTC",
    api_url: Annotated[
        str | None,
        typer.Option(
            "--api-url", envvar="PREFECT_API_URL", help="a Prefect API to serve against instead of the local server"
        ),
    ] = None,
    state_dir: StateDirOption = None,
    port: PortOption = None,
    limit: Annotated[int, typer.Option(help="most flow runs at once")] = 1,
) -> None:
    """Serve retrain and drift-check on cron schedules, starting the local Prefect server if it is not running."""
    server = _server(state_dir, port)
    _offline_environment(server)
    from flows.serve import check_cron, serve_flows

    try:
        check_cron(retrain_cron, "--retrain-cron")
        if not no_drift_check:
            check_cron(drift_check_cron, "--drift-check-cron")
    except ValueError as err:
        raise fail(err) from None
    if api_url is None:
        try:
            server.up(report=typer.echo)
        except PrefectServerError as err:
            raise fail(err, 1) from None
        api_url = server.api_url
    os.environ["PREFECT_API_URL"] = api_url  # the flow runs, in their own processes, report here too

    def ready(served: list[Any]) -> None:
        names = ", ".join(f"{d.flow_name}/{d.name}" for d in served)
        typer.echo(f"serving {names} against {api_url}; Ctrl-C stops")

    serve_flows(
        api_url,
        retrain_cron=retrain_cron,
        drift_check_cron=None if no_drift_check else drift_check_cron,
        timezone=timezone,
        limit=limit,
        on_ready=ready,
    )


# --- run -----------------------------------------------------------------------------------------------------------


def _reach_object_stores(settings: RetrainSettings) -> None:
    """Reach the labeled dataset and the registry where they are on an object store, before any flow run starts: a
    store that refuses or does not answer then ends the command with its one-line error, not a failed run whose
    traceback fills the log after minutes of work."""
    for location in (settings.labeled_dataset, settings.registry):
        if is_url(location):
            try:
                filesystem(location, settings.object_store)
            except ObjectStoreError as err:
                raise fail(err, 1) from None


def _local_api_url(server: LocalPrefectServer) -> str | None:
    """The API a run reports to: ``PREFECT_API_URL``, else the local server when it answers, else None (ephemeral)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    status = server.status()
    return status.api_url if status.healthy else None


def _api_settings(api_url: str | None) -> AbstractContextManager[object]:
    if api_url is None:
        return nullcontext()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: api_url})


@run_app.command("retrain")
def run_retrain(state_dir: StateDirOption = None, port: PortOption = None) -> None:
    """Retrain now: train a candidate, judge it against the champion, promote and roll it out only if it wins."""
    server = _server(state_dir, port)
    _offline_environment(server)
    api_url = _local_api_url(server)
    from flows.retrain import retrain
    from flows.settings import RetrainSettings

    settings = _settings_from_environment(RetrainSettings)
    _reach_object_stores(settings)
    with _api_settings(api_url):
        try:
            result = retrain(settings)
        except (OSError, ValueError, ObjectStoreError) as err:  # missing files, bad data or keys, a store that refuses
            raise fail(err, 1) from None
    typer.echo(f"{result.outcome}: candidate {result.version}")
    typer.echo(f"verdict: {result.comparison.verdict.reason}")
    if result.reason != result.comparison.verdict.reason:
        typer.echo(result.reason)
    typer.echo(f"champion: {result.champion_after or 'none'}")


@run_app.command("drift-check")
def run_drift_check(state_dir: StateDirOption = None, port: PortOption = None) -> None:
    """Check quality and drift now; retrain when a threshold is crossed."""
    server = _server(state_dir, port)
    _offline_environment(server)
    api_url = _local_api_url(server)
    from flows.drift_check import drift_check
    from flows.settings import DriftCheckSettings

    settings = _settings_from_environment(DriftCheckSettings)
    with _api_settings(api_url):
        try:
            result = drift_check(settings)
        except (OSError, ValueError, ObjectStoreError) as err:  # the last: the retrain it started met a failing store
            raise fail(err, 1) from None
    typer.echo(("retrained: " if result.triggered else "no retrain: ") + result.reason)
    if result.retrain is not None:
        typer.echo(f"{result.retrain.outcome}: candidate {result.retrain.version}")
