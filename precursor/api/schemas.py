"""What the HTTP API answers: one pydantic model per shape, so the OpenAPI document describes every field."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from pipelines.flow import FlowReport

T = TypeVar("T")

Risk = Annotated[float, Field(ge=0, le=1)]


class Out(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Page(Out, Generic[T]):
    """One page of results: ``items``, how many match in all, and the offset of the next page (null at the end)."""

    items: list[T]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class OpenAlert(Out):
    kind: str
    raised_at: datetime
    risk: float


class StoredPrediction(Out):
    """What every answer that shows a stored prediction shows of it."""

    max_risk: Risk = Field(description="the highest of the risks: what the prediction is ranked and judged by")
    top_kind: str = Field(description="the failure kind with that risk")
    risk: dict[str, float] = Field(description="probability of each failure kind within the horizon")
    window_start: datetime
    window_end: datetime
    horizon_h: float
    model_name: str
    model_version: str
    edge_id: str
    seq: int


class AtRiskMachine(StoredPrediction):
    """A machine's latest prediction: how risky, why (risk per failure kind), since when."""

    machine_id: str
    threshold: Risk = Field(
        description="the risk this machine is judged at: its model's operating point (as alerts are raised), unless a "
        "fixed threshold was asked for"
    )
    band: Literal["high", "elevated", "low"] = Field(
        description="high: at or above the threshold (at risk); elevated: below it but above the level where an alert "
        "clears; low: below that"
    )
    at_risk: bool
    elevated_since: datetime | None = Field(
        None, description="start of the current run of windows at or above the threshold (looked for up to 7 days)"
    )
    open_alerts: list[OpenAlert] = Field(default_factory=list)


class OperatingPoint(Out):
    """The rule alerts follow: each prediction at its model's threshold unless the fleet overrides it."""

    default_threshold: Risk = Field(description="for predictions that carry no threshold of their own")
    threshold: Risk | None = Field(description="the fleet's override for every model")
    model_thresholds: dict[str, Risk] = Field(description="the fleet's override per model name")
    clear_factor: float = Field(description="an alert clears below threshold x clear_factor")


class FleetSummary(Out):
    machines: int
    at_risk: int = Field(description="machines whose latest risk is at or above their threshold")
    threshold: float | None = Field(description="the fixed threshold asked for; null: each model's operating point")
    operating_point: OperatingPoint
    edges: int
    model_versions: int
    open_alerts: int
    newest_window_end: datetime | None


class ReasonDetail(Out):
    statistic: str | None = Field(None, description="mean, std, slope, last, min or max, for a sensor")
    block: int | None = Field(None, description="the block of the window the statistic mattered most in")
    from_h: float | None = Field(None, description="hours before the window end the evidence starts")
    to_h: float | None = Field(None, description="hours before the window end the evidence ends (0: the end)")
    count: int | None = Field(None, description="how many such events the window's context holds")
    age_h: float | None = Field(None, description="hours since the part's maintenance or the last failure")


class Reason(Out):
    """What moved a prediction's risk: the edge took it out of the window and the risk fell by ``risk_drop``."""

    kind: Literal["sensor", "event", "context"]
    name: str
    risk_drop: float
    detail: ReasonDetail | None = None
    text: str = Field(description="the reason in words, e.g. 'vibration_rms level high in the last 1.5 h'")


Reasons = Annotated[
    list[Reason] | None,
    Field(
        description="what moved the risk most, largest first, as the edge found it by occlusion (alerting windows of "
        "an explainable model only; null where it did not explain the prediction)"
    ),
]


class PredictionRow(StoredPrediction):
    reasons: Reasons = None


class LatestPrediction(PredictionRow):
    machine_id: str


class MachineSummary(Out):
    machine_id: str
    predictions: int
    first_window_end: datetime | None
    last_window_end: datetime | None
    edges: list[str] | None
    model_versions: list[str] | None
    events: dict[str, int]
    latest: LatestPrediction | None


class RiskPoint(Out):
    """The peak risk of one time bucket (so no spike is lost when a long history is drawn in few points)."""

    t: datetime
    risk: float
    risk_mean: float
    top_kind: str
    windows: int


class EventRow(Out):
    machine_id: str
    ts: datetime
    event: str
    kind: str
    detail: str | None
    edge_id: str
    seq: int


class FailureRow(Out):
    """A failure and how well it was foreseen."""

    machine_id: str
    failed_at: datetime
    failure_kind: str
    event: str
    previous_failure_at: datetime | None
    warned_at: datetime | None = Field(description="first window at or above the threshold that covered the failure")
    lead_time_h: float | None = Field(description="hours from warned_at to the failure")
    peak_risk: float | None
    windows_before: int
    caught: bool
    threshold: float


class SensorPoint(Out):
    """One sensor over the summaries that end in a bucket; ``t``: the last one's end."""

    t: datetime
    mean: float | None
    min: float | None
    max: float | None
    last: float | None = Field(None, description="the latest reading with a value")
    samples: int = Field(description="readings with a value for this sensor")


class TelemetrySeries(Out):
    machine_id: str
    sensors: dict[str, list[SensorPoint]] = Field(
        description="sensor -> summary points; empty where no telemetry summaries are stored (raw stays at the edge)"
    )


class MachineTimeline(Out):
    """Everything a machine page draws, in one answer."""

    summary: MachineSummary
    risk: list[RiskPoint]
    events: list[EventRow]
    failures: list[FailureRow]
    alerts: list[AlertRow]
    telemetry: dict[str, list[SensorPoint]]
    threshold: float


class AlertRow(Out):
    machine_id: str
    kind: str
    state: Literal["raised", "cleared"] | str
    at: datetime
    risk: float
    model_version: str
    reasons: list[Reason] | None = Field(
        None, description="the reasons of the prediction that decided the alert, where its edge explained it"
    )


class ModelVersionUsage(Out):
    edge_id: str
    model_name: str
    model_version: str
    predictions: int
    machines: int
    first_window_end: datetime
    last_window_end: datetime


class VersionShare(Out):
    model_name: str
    model_version: str
    machines: int


class HeartbeatView(Out):
    """An edge's newest heartbeat that is not forged: what it runs and how far behind it is."""

    heartbeat_at: datetime
    model_name: str
    model_version: str
    model_sha256: str | None = Field(description="sha256 of the model artifact the edge scores with; null: a baseline")
    outbox_depth: int = Field(description="messages the edge has stored and Kafka has not yet acknowledged")
    lag_s: float = Field(description="age in seconds of the oldest of those messages; 0 when none wait")
    health: str = Field(description="ok, degraded or failing, as the edge judges itself")
    machines: int = Field(description="machines the edge has windows for")
    trust: Literal["verified", "unsigned"] = Field(
        description="verified: signed by a key enrolled for this edge; unsigned: no signature (forged heartbeats are "
        "never shown here, see identity)"
    )
    model_known: bool | None = Field(
        description="whether model_sha256 is a release in the model registry; null: no registry configured, or no "
        "artifact (a built-in baseline)"
    )
    agent_version: str | None
    agent_sha256: str | None = Field(description="sha256 of the agent's source files, as the edge reports it")
    key_id: str | None


class EdgeIdentity(Out):
    """Whether an edge's heartbeats prove who sent them."""

    trust: Literal["verified", "unsigned"] | None = Field(description="of its newest heartbeat that is not forged")
    verified: int
    unsigned: int
    forged: int = Field(description="heartbeats in its name whose signature does not hold, or by a key not enrolled")
    last_forged_at: datetime | None = Field(description="when the newest forged one was stored")
    last_forged_reason: str | None
    unknown_model: bool = Field(description="its newest heartbeat reports a model that is no known release")
    flags: list[Literal["forged", "unsigned", "unknown_model"]]


class EdgeRollout(Out):
    """Which model an edge runs, and whether that is the fleet's newest."""

    edge_id: str
    machines: int
    versions: list[VersionShare]
    last_window_end: datetime | None
    running_version: str | None
    newest_version: str | None
    on_newest: int
    status: Literal["current", "rolling", "behind"]
    heartbeat: HeartbeatView | None
    identity: EdgeIdentity


class QualityPoint(Out):
    """Precision and recall of one model version over one period."""

    model_name: str
    model_version: str
    bucket_start: datetime
    bucket_end: datetime
    windows: int
    tp: int = Field(description="windows at or above the threshold that a failure followed within the horizon")
    fp: int = Field(description="windows at or above the threshold that no failure followed")
    fn: int = Field(description="windows below the threshold that a failure followed")
    tn: int = Field(description="windows below the threshold that no failure followed")
    precision: float | None = Field(description="tp / (tp + fp); null when no window was at or above the threshold")
    recall: float | None = Field(description="tp / (tp + fn); null when no failure followed any window")
    failures: int | None = Field(description="distinct failures the windows lead up to; null where computed")
    failures_caught: int | None = Field(description="those failures with a window at or above the threshold before")
    mean_lead_time_h: float | None = Field(description="per caught failure, hours from its first such window to it")
    threshold: float
    source: Literal["model_metrics", "computed"] = Field(
        description="model_metrics: the monitoring pipeline's figures; computed: from predictions and failures here"
    )


class EdgeCounts(Out):
    edge_id: str
    predictions: int
    machines: int
    latest_window_end: datetime | None
    max_seq: int


class SqlQuery(BaseModel):
    """One read-only statement. Anything but a single SELECT (or WITH ... SELECT) is refused."""

    model_config = ConfigDict(extra="forbid")

    sql: Annotated[str, Field(min_length=1, max_length=20_000, examples=["SELECT count(*) FROM predictions"])]
    limit: Annotated[int, Field(ge=1, le=10_000)] = 1000


class SqlAnswer(Out):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool = Field(
        description="true when the statement had more rows than the limit, or more bytes than the byte limit"
    )
    elapsed_ms: float


class Health(Out):
    status: Literal["ok"]
    version: str


class Problem(Out):
    """An error: what was wrong, in words that name the field and value."""

    detail: str


Flow = FlowReport
"""``GET /flow``: the stages from reading to store with the bottleneck marked, and cost per prediction. The model is
:class:`pipelines.flow.FlowReport`, which ``precursor status`` prints too."""


MachineTimeline.model_rebuild()
