"""The HTTP API: the questions of ``precursor query`` with pagination and filters, raw read-only SQL, the live tail.

Every data endpoint needs a bearer token. Each request opens the store read-only for just as long as it takes to
answer, so the pipeline's writer is never shut out for more than a query's length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request, status

from models.training.calibration_report import VersionCalibration, registry_calibrations
from pipelines.flow import FlowSettings, flow_report
from pipelines.settings import PipelineSettings
from precursor.api.auth import Authenticated
from precursor.api.live import LIVE_TOPICS, EventStreamResponse, KafkaTail, LiveTopic, live_events, parse_start
from precursor.api.schemas import (
    AlertRow,
    AtRiskMachine,
    EdgeCounts,
    EdgeRollout,
    EventRow,
    FailureRow,
    FleetSummary,
    Flow,
    MachineSummary,
    MachineTimeline,
    ModelVersionUsage,
    Page,
    PredictionRow,
    Problem,
    QualityPoint,
    RiskPoint,
    SqlAnswer,
    SqlQuery,
    TelemetrySeries,
)
from precursor.api.settings import ApiSettings
from precursor.contracts.alerting import AlertRule
from precursor.contracts.durations import parse_duration
from precursor.contracts.object_store import ObjectStoreError
from precursor.contracts.outcomes import ANY_FAILURE
from precursor.contracts.settings import KafkaSettings
from precursor.store.db import StoreBusy
from precursor.store.queries import Page as StorePage
from precursor.store.queries import SqlRejected, StoreAttacher, StoreReader, check_range, parse_time_bound, reading

IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$"

MachineId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=IDENTIFIER, description="a machine id, e.g. m-001")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows per page")]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000, description="rows to skip")]
Since = Annotated[
    str | None,
    Query(max_length=64, description="from: a duration back from now (6h, 7d), 'now', or a time (2026-01-01T00:00Z)"),
]
Until = Annotated[str | None, Query(max_length=64, description="to: same forms as since")]
Threshold = Annotated[float | None, Query(ge=0, le=1, description="risk that counts as a warning [default: setting]")]
Filter = Annotated[str | None, Query(min_length=1, max_length=128)]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no valid bearer token"},
    422: {"model": Problem, "description": "a parameter is malformed; the detail names it and its value"},
    503: {"model": Problem, "description": "the store is missing or busy; retry"},
}
MACHINE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    404: {"model": Problem, "description": "no machine with that id"},
}

router = APIRouter(prefix="/api/v1", dependencies=[Authenticated], responses=ERRORS)


@dataclass(frozen=True)
class TimeRange:
    since: datetime | None
    until: datetime | None


def time_range(since: Since = None, until: Until = None) -> TimeRange:
    """Parse ``since``/``until``; 422 naming the parameter and its value when either is malformed. A route takes
    both query parameters, parsed, as one ``window: Window``."""
    try:
        start = parse_time_bound(since, name="since") if since is not None else None
        end = parse_time_bound(until, name="until") if until is not None else None
        check_range(start, end)
    except ValueError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from None
    return TimeRange(start, end)


Window = Annotated[TimeRange, Depends(time_range)]


def _settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def _threshold(request: Request, given: float | None) -> float:
    return _settings(request).risk_threshold if given is None else given


def _fixed_threshold(request: Request, given: float | None) -> float | None:
    """A threshold asked for, or set for the API on purpose; ``None``: each model's operating point."""
    if given is not None:
        return given
    settings = _settings(request)
    return settings.risk_threshold if "risk_threshold" in settings.model_fields_set else None


def _alert_rule(request: Request) -> AlertRule:
    """The operating point the pipeline alerts at (``PRECURSOR_PIPELINE_ALERT_*``), so the pages call at risk what
    the alerts do. Read once per app; an app built with ``app.state.alert_rule`` set uses that one."""
    state = request.app.state
    if getattr(state, "alert_rule", None) is None:
        state.alert_rule = PipelineSettings().alert_rule
    return state.alert_rule


@contextmanager
def open_store(request: Request, *, raw_sql: bool = False) -> Iterator[StoreReader]:
    """The store, read-only, for one request. Raw SQL gets a connection of its own that cannot reach files or the
    network; the canned questions share the app's in-memory instance and attach the file just for the request."""
    settings = _settings(request)
    attacher: StoreAttacher = request.app.state.store
    try:
        with reading(settings.store_path, wait_s=settings.store_wait_s) if raw_sql else attacher.reading() as store:
            yield store
    except FileNotFoundError as err:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(err)) from None
    except StoreBusy:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "the prediction store is busy (a writer holds it); retry shortly",
            headers={"Retry-After": "1"},
        ) from None


def _unknown_machine(machine_id: str) -> HTTPException:
    return HTTPException(
        status.HTTP_404_NOT_FOUND, f"unknown machine {machine_id!r}: the store has no predictions or events for it"
    )


@contextmanager
def open_machine(request: Request, machine_id: str) -> Iterator[StoreReader]:
    """The store, for a question about one machine: 404 when it holds nothing of that machine."""
    with open_store(request) as store:
        if not store.machine_exists(machine_id):
            raise _unknown_machine(machine_id)
        yield store


def _page(page: StorePage) -> dict[str, Any]:
    following = page.offset + len(page.rows)
    return {
        "items": page.rows,
        "total": page.total,
        "limit": page.limit,
        "offset": page.offset,
        "next_offset": following if following < page.total else None,
    }


# -- fleet -----------------------------------------------------------------------------------------------------


@router.get("/fleet/summary", response_model=FleetSummary, summary="Machines, how many are at risk, open alerts")
def fleet_summary(request: Request, threshold: Threshold = None) -> dict[str, Any]:
    with open_store(request) as store:
        return store.fleet_summary(_fixed_threshold(request, threshold), _alert_rule(request))


@router.get("/machines/at-risk", response_model=Page[AtRiskMachine], summary="What is at risk now, why, since when")
def machines_at_risk(
    request: Request,
    limit: Limit = 50,
    offset: Offset = 0,
    since: Since = None,
    min_risk: Annotated[float | None, Query(ge=0, le=1)] = None,
    edge_id: Filter = None,
    model_version: Filter = None,
    kind: Filter = None,
    threshold: Threshold = None,
) -> dict[str, Any]:
    """Each machine's latest prediction, riskiest first. ``since`` keeps machines whose latest window ended after
    it; ``elevated_since`` is when the machine's current run of windows at or above the threshold began."""
    window = time_range(since, None)
    with open_store(request) as store:
        page = store.at_risk(
            limit=limit,
            offset=offset,
            since=window.since,
            min_risk=min_risk,
            edge_id=edge_id,
            model_version=model_version,
            kind=kind,
            threshold=_fixed_threshold(request, threshold),
            rule=_alert_rule(request),
        )
    return _page(page)


@router.get("/machines/{machine_id}", response_model=MachineSummary, responses=MACHINE_ERRORS)
def machine(request: Request, machine_id: MachineId) -> dict[str, Any]:
    """What the store knows of one machine: counts, first and last window, edges, model versions, latest risk."""
    with open_store(request) as store:
        summary = store.machine_summary(machine_id)
    if summary is None:
        raise _unknown_machine(machine_id)
    return summary


@router.get("/machines/{machine_id}/predictions", response_model=Page[PredictionRow], responses=MACHINE_ERRORS)
def machine_predictions(
    request: Request,
    machine_id: MachineId,
    window: Window,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """One machine's predictions, newest first."""
    with open_machine(request, machine_id) as store:
        page = store.machine_history(machine_id, limit=limit, offset=offset, since=window.since, until=window.until)
    return _page(page)


@router.get("/machines/{machine_id}/risk", response_model=list[RiskPoint], responses=MACHINE_ERRORS)
def machine_risk(
    request: Request,
    machine_id: MachineId,
    window: Window,
    points: Annotated[int, Query(ge=10, le=5000, description="at most this many points")] = 500,
) -> list[dict[str, Any]]:
    """Predicted risk over time: the peak of each time bucket."""
    with open_machine(request, machine_id) as store:
        return store.risk_series(machine_id, since=window.since, until=window.until, points=points)


@router.get("/machines/{machine_id}/events", response_model=Page[EventRow], responses=MACHINE_ERRORS)
def machine_events(
    request: Request,
    machine_id: MachineId,
    window: Window,
    kind: Annotated[list[str] | None, Query(max_length=10, description="failure, maintenance, error, anomaly")] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """One machine's events, newest first."""
    with open_machine(request, machine_id) as store:
        page = store.machine_events(
            machine_id, kinds=kind, limit=limit, offset=offset, since=window.since, until=window.until
        )
    return _page(page)


@router.get("/machines/{machine_id}/failures", response_model=Page[FailureRow], responses=MACHINE_ERRORS)
def machine_failures(
    request: Request,
    machine_id: MachineId,
    window: Window,
    threshold: Threshold = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """One machine's failures, each with its warning and lead time."""
    with open_machine(request, machine_id) as store:
        page = store.failures(
            machine_id,
            threshold=_threshold(request, threshold),
            limit=limit,
            offset=offset,
            since=window.since,
            until=window.until,
        )
    return _page(page)


@router.get("/machines/{machine_id}/telemetry", response_model=TelemetrySeries, responses=MACHINE_ERRORS)
def machine_telemetry(
    request: Request,
    machine_id: MachineId,
    window: Window,
    sensor: Annotated[list[str] | None, Query(max_length=64)] = None,
    points: Annotated[int, Query(ge=10, le=5000)] = 300,
) -> dict[str, Any]:
    """Sensor summaries over time, where the site sends them (raw telemetry stays at the edge by default)."""
    with open_machine(request, machine_id) as store:
        series = store.telemetry_series(
            machine_id, sensors=sensor, since=window.since, until=window.until, points=points
        )
    return {"machine_id": machine_id, "sensors": series}


@router.get("/machines/{machine_id}/timeline", response_model=MachineTimeline, responses=MACHINE_ERRORS)
def machine_timeline(
    request: Request,
    machine_id: MachineId,
    window: Window,
    threshold: Threshold = None,
    points: Annotated[int, Query(ge=10, le=5000)] = 600,
) -> dict[str, Any]:
    """Everything a machine page draws, over one connection: summary, risk, events, failures with lead times,
    alerts and sensor lines."""
    fixed = _fixed_threshold(request, threshold)
    with open_store(request) as store:
        summary = store.machine_summary(machine_id)
        if summary is None:
            raise _unknown_machine(machine_id)
        # The machine's operating point, as its alerts are raised, unless a fixed threshold was asked for.
        level = fixed if fixed is not None else store.operating_point(machine_id, _alert_rule(request))
        span = {"since": window.since, "until": window.until}
        return {
            "summary": summary,
            "risk": store.risk_series(machine_id, points=points, **span),
            "events": store.machine_events(machine_id, limit=1000, **span).rows,
            "failures": store.failures(machine_id, threshold=level, limit=1000, **span).rows,
            "alerts": store.alerts(machine_id=machine_id, limit=1000, **span).rows,
            "telemetry": store.telemetry_series(machine_id, points=points // 2, **span),
            "threshold": level,
        }


# -- events, failures and alerts across the fleet -------------------------------------------------------------


@router.get("/failures", response_model=Page[FailureRow])
def failures(
    request: Request,
    window: Window,
    threshold: Threshold = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """Failures across the fleet, newest first, each with its warning and lead time."""
    with open_store(request) as store:
        page = store.failures(
            threshold=_threshold(request, threshold), limit=limit, offset=offset, since=window.since, until=window.until
        )
    return _page(page)


@router.get("/alerts", response_model=Page[AlertRow])
def alerts(
    request: Request,
    window: Window,
    machine_id: Annotated[str | None, Query(max_length=128, pattern=IDENTIFIER)] = None,
    state: Annotated[str | None, Query(pattern="^(raised|cleared)$")] = None,
    kind: Filter = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """Alerts raised and cleared by the pipelines, newest first (empty until the pipelines store any)."""
    with open_store(request) as store:
        page = store.alerts(
            machine_id=machine_id,
            state=state,
            kind=kind,
            limit=limit,
            offset=offset,
            since=window.since,
            until=window.until,
        )
    return _page(page)


# -- models ----------------------------------------------------------------------------------------------------


@router.get("/models/versions", response_model=list[ModelVersionUsage])
def model_versions(request: Request, window: Window, edge_id: Filter = None) -> Any:
    """Which model versions each edge ran, with their first and last window."""
    with open_store(request) as store:
        return store.model_versions(edge_id=edge_id, since=window.since, until=window.until)


@router.get("/models/rollout", response_model=list[EdgeRollout])
def model_rollout(request: Request) -> Any:
    """Per edge: the versions its machines run, its newest heartbeat, and whether it runs the fleet's newest; and
    whether it proves who it is (``identity.flags``: forged heartbeats in its name, unsigned heartbeats, a model
    that is no known release)."""
    with open_store(request) as store:
        return store.rollout()


@router.get("/models/quality", response_model=list[QualityPoint])
def model_quality(
    request: Request,
    window: Window,
    bucket: Annotated[str, Query(max_length=16, description="period per point: 6h, 1d, 7d")] = "1d",
    threshold: Threshold = None,
    model_version: Filter = None,
    kind: Annotated[
        str, Query(min_length=1, max_length=128, description="failure kind of the pipeline's metrics; 'failure' = any")
    ] = ANY_FAILURE,
) -> Any:
    """Precision and recall per model version over time: the monitoring pipeline's figures where it has written
    any (in its own windows), otherwise computed from predictions and failures per ``bucket``."""
    try:
        width = parse_duration(bucket)
    except ValueError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"bucket: {err}") from None
    if not timedelta(hours=1) <= width <= timedelta(days=366):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"bucket={bucket!r} must be between 1h and 366d")
    with open_store(request) as store:
        return store.quality(
            bucket=width,
            threshold=_threshold(request, threshold),
            model_version=model_version,
            kind=kind,
            since=window.since,
            until=window.until,
        )


@router.get("/models/calibration", response_model=list[VersionCalibration])
def model_calibration(request: Request) -> Any:
    """Per registered model version: its calibration map (method, parameters, why it is what it is) and the
    validation period's ECE and Brier score before and after it, read from the version's ``precursor.json``. An
    empty list where no registry is configured (``PRECURSOR_API_MODEL_REGISTRY``): the dashboard asks on every visit
    to its models page, and a 404 there would read as a broken page."""
    registry = _settings(request).model_registry
    if registry is None:
        return []
    try:
        return registry_calibrations(registry)
    except (OSError, ObjectStoreError) as err:  # a folder gone, a bucket that refuses or does not answer
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(err)) from None


@router.get("/edges", response_model=list[EdgeCounts])
def edges(request: Request) -> Any:
    """Predictions and machines per edge, and when each was last heard of."""
    with open_store(request) as store:
        return store.counts_per_edge()


# -- the dataflow ----------------------------------------------------------------------------------------------


@router.get("/flow", response_model=Flow, summary="The dataflow from reading to store, its bottleneck, and cost")
def flow(request: Request) -> Any:
    """Stage by stage (edge agents, Kafka, pipeline, store): what arrives, what passes on, what waits, which stage
    is the bottleneck by the rule in ``rule``, and CPU and energy per 1,000 predictions. Edge figures come from the
    edges' newest heartbeats on Kafka; what cannot be read (Kafka down, no store yet) is named in ``problems`` and
    the rest is answered. Settings: ``PRECURSOR_FLOW_*`` (window, thresholds), ``PRECURSOR_ENERGY_*`` (power model)."""
    state = request.app.state
    if getattr(state, "flow_settings", None) is None:
        state.flow_settings = FlowSettings()
    settings = _settings(request)
    return flow_report(
        state.kafka,
        settings.store_path,
        settings=state.flow_settings,
        enrolled_edges=PipelineSettings().enrolled_edges,
        model_registry=settings.model_registry,
    )


# -- raw SQL ---------------------------------------------------------------------------------------------------


@router.post(
    "/sql",
    response_model=SqlAnswer,
    responses={400: {"model": Problem, "description": "not a single read-only SELECT, invalid, or over a limit"}},
)
def run_sql(request: Request, query: Annotated[SqlQuery, Body()]) -> Any:
    """One read-only SELECT over the store (tables: predictions, events, alerts, heartbeats, ...). Writes, several
    statements, file or network access are refused with 400; nothing is ever modified."""
    settings = _settings(request)
    try:
        with open_store(request, raw_sql=True) as store:
            return store.sql(
                query.sql,
                limit=min(query.limit, settings.sql_max_rows),
                timeout_s=settings.sql_timeout_s,
                max_bytes=settings.sql_max_bytes,
            ).__dict__
    except SqlRejected as err:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(err)) from None


# -- live ------------------------------------------------------------------------------------------------------


@router.get(
    "/live",
    response_class=EventStreamResponse,
    status_code=status.HTTP_200_OK,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def live(
    request: Request,
    topic: Annotated[list[LiveTopic] | None, Query(description="predictions, alerts (default both)")] = None,
    start: Annotated[
        str | None,
        Query(
            alias="from",
            max_length=8192,
            description="'latest' (default), 'earliest', or a cursor (an event id) to resume after",
        ),
    ] = None,
    machine_id: Annotated[str | None, Query(max_length=128, pattern=IDENTIFIER)] = None,
    limit: Annotated[int | None, Query(ge=1, le=1_000_000, description="end the stream after this many events")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=8192)] = None,
) -> EventStreamResponse:
    """Predictions and alerts as server-sent events, straight from Kafka. Every event's id is a cursor: pass it
    back as ``from`` (or ``Last-Event-ID``) to resume exactly after it. The first event, ``ready``, carries the
    starting cursor."""
    try:
        begin = parse_start(start or last_event_id or "latest")
    except ValueError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from None
    settings = _settings(request)
    kafka: KafkaSettings = request.app.state.kafka
    tail = KafkaTail(kafka, topic or list(LIVE_TOPICS), begin, poll_ms=settings.live_poll_ms)
    try:
        cursor = await anyio.to_thread.run_sync(tail.open)
    except Exception as err:  # broker down, topic missing: the stream cannot start
        await anyio.to_thread.run_sync(tail.close)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"cannot tail Kafka at {kafka.bootstrap_servers}: {err}",
            headers={"Retry-After": "5"},
        ) from None
    events = live_events(tail, cursor, machine_id=machine_id, limit=limit, keepalive_s=settings.live_keepalive_s)
    return EventStreamResponse(events, on_close=tail.close)
