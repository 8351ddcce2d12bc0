"""``precursor flows serve``: the flows as deployments with cron schedules, served against a Prefect server.

The server is the local one this project starts in the background
(:class:`~infra.prefect_server.LocalPrefectServer`), or any Prefect API named by ``--api-url`` / ``PREFECT_API_URL``.
The serving process polls the server for scheduled runs and runs each in a subprocess, which imports the flow by
module path (``flows.retrain.retrain``), so the working directory does not matter. Settings reach the runs through
the environment (``PRECURSOR_RETRAIN_*``, ``PRECURSOR_DRIFT_*``, ``PRECURSOR_KAFKA_*``): secrets stay out of the
server's database, where deployment parameters are stored.

Cron strings are standard five fields (``0 3 * * *``: daily at 03:00) or, for tests, six with seconds last
(``* * * * * */10``: every ten seconds). Times are in ``timezone`` (UTC by default).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect import serve
from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import RunnerDeployment
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.types.entrypoint import EntrypointType

from flows.drift_check import drift_check
from flows.retrain import retrain

RETRAIN_DEPLOYMENT = "retrain-scheduled"
DRIFT_CHECK_DEPLOYMENT = "drift-check-scheduled"
DEFAULT_RETRAIN_CRON = "0 3 * * *"
DEFAULT_DRIFT_CHECK_CRON = "0 * * * *"


def check_cron(cron: str, option: str) -> str:
    """The cron string, or a ValueError naming the option and the value.

    >>> check_cron("0 3 * * *", "--retrain-cron")
    '0 3 * * *'
    >>> check_cron("every day", "--retrain-cron")
    Traceback (most recent call last):
    ...
    ValueError: --retrain-cron='every day' is not a valid cron string (e.g. '0 3 * * *' for 03:00 daily)
    """
    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise ValueError(f"{option}={cron!r} is not a valid cron string (e.g. '0 3 * * *' for 03:00 daily)") from None
    return cron


def deployments(
    *, retrain_cron: str | None, drift_check_cron: str | None, timezone: str = "UTC"
) -> list[RunnerDeployment]:
    """The scheduled deployments: ``retrain`` and ``drift-check``, each left out when its cron is None."""
    out = []
    for flow_, name, cron, what in (
        (retrain, RETRAIN_DEPLOYMENT, retrain_cron, "retrain on the labeled evidence"),
        (drift_check, DRIFT_CHECK_DEPLOYMENT, drift_check_cron, "retrain when quality drops or inputs drift"),
    ):
        if cron is None:
            continue
        out.append(
            flow_.to_deployment(
                name=name,
                schedule=CronSchedule(cron=cron, timezone=timezone),
                description=f"{what}; scheduled {cron} ({timezone})",
                tags=["precursor"],
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
    if not out:
        raise ValueError("nothing to serve: give a cron for retrain, drift-check or both")
    return out


def serve_flows(
    api_url: str,
    *,
    retrain_cron: str | None = DEFAULT_RETRAIN_CRON,
    drift_check_cron: str | None = DEFAULT_DRIFT_CHECK_CRON,
    timezone: str = "UTC",
    limit: int | None = 1,
    on_ready: Callable[[list[RunnerDeployment]], None] | None = None,
) -> None:
    """Register the deployments with the server at ``api_url`` and run their scheduled runs until interrupted.

    ``limit`` bounds concurrent runs (one by default: two trainings at once would only slow each other down).
    """
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        served = deployments(retrain_cron=retrain_cron, drift_check_cron=drift_check_cron, timezone=timezone)
        if on_ready is not None:
            on_ready(served)
        serve(*served, limit=limit, print_starting_message=False)
