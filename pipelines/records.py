"""Validated messages as plain tuples: what travels between pipeline stages.

Messages are validated once, by their pydantic contract, at the edge of the pipeline. After that they travel as plain
tuples of str, int and float, with times as epoch microseconds (Beam's own timestamp unit): Beam encodes those with
its fast primitive coder, where a pydantic object (or even a NamedTuple) falls back to pickling, several times slower
at every shuffle. The NamedTuples below name the fields for readers; stages emit ``tuple(record)`` and rebuild the
names with ``Record(*row)`` where they read fields.

>>> from precursor.contracts.messages import Prediction
>>> p = Prediction(edge_id="e1", seq=3, machine_id="pump-1", window_start="2026-01-01T00:00:00Z",
...                window_end="2026-01-01T00:30:00Z", horizon_h=24, risk={"failure": 0.5, "bearing": 0.25},
...                model_name="lm", model_version="2", emitted_at="2026-01-01T00:31:00Z")
>>> r = prediction_record(p, partition=0, offset=17)
>>> r.window_end_us == to_micros(p.window_end), r.risk
(True, (('bearing', 0.25), ('failure', 0.5)))
>>> PredictionRecord(*tuple(r)) == r
True
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from precursor.contracts.messages import EdgeEvent, Heartbeat, Prediction, TelemetrySummary, event_detail, event_kind

MICROS = 1_000_000
HOUR_US = 3600 * MICROS

RiskPairs = tuple[tuple[str, float], ...]
"""A risk dict as (kind, probability) pairs sorted by kind: hashable, deterministic and cheap to encode."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """Epoch microseconds of an aware datetime, exactly (no float rounding: timedelta division is integer)."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(micros: int) -> datetime:
    return datetime.fromtimestamp(micros // MICROS, UTC).replace(microsecond=micros % MICROS)


def iso(micros: int) -> str:
    """``2026-01-01T00:30:00Z``: for messages and error texts."""
    return from_micros(micros).isoformat().replace("+00:00", "Z")


class PredictionRecord(NamedTuple):
    edge_id: str
    seq: int
    machine_id: str
    window_start_us: int
    window_end_us: int
    horizon_h: float
    risk: RiskPairs
    model_name: str
    model_version: str
    emitted_at_us: int
    partition: int  # where it was read from: the arrival order that lateness is judged by
    offset: int
    threshold: float | None = None  # the model's own alert threshold, when it sent one
    reasons: str | None = None  # what moved the risk most (JSON, as the edge explained it), when it did

    @property
    def risk_dict(self) -> dict[str, float]:
        return dict(self.risk)

    @property
    def horizon_us(self) -> int:
        return round(self.horizon_h * HOUR_US)


class EventRecord(NamedTuple):
    edge_id: str
    seq: int
    machine_id: str
    at_us: int
    event: str
    partition: int
    offset: int

    @property
    def kind(self) -> str:
        return event_kind(self.event)

    @property
    def detail(self) -> str | None:
        return event_detail(self.event)


class HeartbeatRecord(NamedTuple):
    edge_id: str
    seq: int
    trust: str  # verified, unsigned or forged (pipelines.edge_trust): with (edge_id, seq), what makes one unique
    at_us: int
    model_name: str
    model_version: str
    model_sha256: str | None
    outbox_depth: int
    lag_s: float
    health: str
    machines: int
    trust_reason: str | None
    model_known: bool | None
    agent_version: str | None
    agent_sha256: str | None
    key_id: str | None
    flow: str | None  # the heartbeat's EdgeFlow as JSON, when the edge sent one
    partition: int
    offset: int


HEARTBEAT_IDENTITY = 3
"""A heartbeat is one per (edge_id, seq, trust): a forged one that reuses a real heartbeat's (edge_id, seq) is kept
beside it, not in its place, and cannot make the real one count as a duplicate."""


SensorStats = tuple[str, float, float, float, float, int]
"""One sensor of a telemetry summary: (sensor, mean, min, max, last, count)."""


class TelemetrySummaryRecord(NamedTuple):
    edge_id: str
    seq: int
    machine_id: str
    window_start_us: int
    window_end_us: int
    readings: int
    sensors: tuple[SensorStats, ...]  # sorted by sensor
    partition: int
    offset: int


def prediction_record(p: Prediction, *, partition: int, offset: int) -> PredictionRecord:
    return PredictionRecord(
        p.edge_id,
        p.seq,
        p.machine_id,
        to_micros(p.window_start),
        to_micros(p.window_end),
        p.horizon_h,
        tuple(sorted(p.risk.items())),
        p.model_name,
        p.model_version,
        to_micros(p.emitted_at),
        partition,
        offset,
        p.threshold,
        reasons_json(p),
    )


def reasons_json(p: Prediction) -> str | None:
    """A prediction's reasons as compact JSON (unset fields left out), or None where the edge sent none."""
    if p.reasons is None:
        return None
    return json.dumps([r.model_dump(mode="json", exclude_none=True) for r in p.reasons], separators=(",", ":"))


def event_record(e: EdgeEvent, *, partition: int, offset: int) -> EventRecord:
    return EventRecord(e.edge_id, e.seq, e.machine_id, to_micros(e.timestamp), e.event, partition, offset)


def heartbeat_record(
    h: Heartbeat,
    *,
    partition: int,
    offset: int,
    trust: str,
    trust_reason: str | None,
    model_known: bool | None,
) -> HeartbeatRecord:
    return HeartbeatRecord(
        h.edge_id,
        h.seq,
        trust,
        to_micros(h.timestamp),
        h.model_name,
        h.model_version,
        h.model_sha256,
        h.outbox_depth,
        h.lag_s,
        h.health,
        h.machines,
        trust_reason,
        model_known,
        h.agent.version if h.agent else None,
        h.agent.sha256 if h.agent else None,
        h.signature.key_id if h.signature else None,
        h.flow.model_dump_json() if h.flow else None,
        partition,
        offset,
    )


def telemetry_summary_record(s: TelemetrySummary, *, partition: int, offset: int) -> TelemetrySummaryRecord:
    sensors = tuple((name, v.mean, v.min, v.max, v.last, v.count) for name, v in sorted(s.sensors.items()))
    return TelemetrySummaryRecord(
        s.edge_id,
        s.seq,
        s.machine_id,
        to_micros(s.window_start),
        to_micros(s.window_end),
        s.readings,
        sensors,
        partition,
        offset,
    )
