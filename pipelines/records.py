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
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from pydantic_core import from_json

from precursor.contracts.messages import EdgeEvent, Heartbeat, Prediction, TelemetrySummary

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


def risk_json(risk: RiskPairs) -> str:
    """``json.dumps(dict(risk), sort_keys=True)``, for the store's ``risk`` column, without the encoder's cost: the
    kinds are validated identifiers (``[A-Za-z0-9_.:-]``, nothing to escape), already sorted, and the values finite
    floats, which JSON writes as their repr.

    >>> risk_json((("bearing", 0.25), ("failure", 1e-07)))
    '{"bearing": 0.25, "failure": 1e-07}'
    """
    return "{" + ", ".join([f'"{kind}": {p!r}' for kind, p in risk]) + "}"


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


# --- Predictions straight from their JSON to a record tuple --------------------------------------------------------
#
# Validating a prediction through its pydantic model and then taking the model apart into a tuple costs about 15 µs;
# most predictions an edge sends have the one plain form its encoder writes. `prediction_tuple` reads that form with
# pydantic's JSON parser and checks every field against the same constraints as `Prediction`, and says None for anything
# else (other spellings of a time, numbers as strings, reasons, a missing field, anything out of range): the caller
# then validates that record with pydantic, which accepts it with the same result or names what is wrong. So what it
# accepts is a subset of what `Prediction` accepts, giving the same tuple, and every dead letter keeps pydantic's
# reason. tests/test_prediction_tuples.py holds it to that with generated and mutated messages.

_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")  # contracts.messages.Identifier, anchored by fullmatch
_INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:\d\d)")
_PREDICTION_KEYS = frozenset(
    ("schema_version", "edge_id", "seq", "machine_id", "window_start", "window_end", "horizon_h", "risk",
     "model_name", "model_version", "emitted_at", "threshold", "reasons")
)  # fmt: skip
_MAX_COUNT = 2**63 - 1
_MAX_HORIZON_H = 24 * 365
_SEEN_LIMIT = 65_536

# The same few machine, edge, model and kind names and window times come again and again: each is checked once and
# its first string kept, so records share their strings (smaller pickles at the shuffle, fewer objects).
_identifiers: dict[str, str] = {}
_instants: dict[str, int] = {}
_versions: dict[str, str] = {}


def _remember(seen: dict[str, Any], value: str, checked: Any) -> Any:
    """Keeps ``value``'s checked form for the next time it comes (the table is emptied when full: a bound, not an
    eviction policy)."""
    if len(seen) >= _SEEN_LIMIT:
        seen.clear()
    seen[value] = checked
    return checked


def _identifier(value: object) -> str | None:
    if type(value) is not str:
        return None
    known = _identifiers.get(value)
    if known is not None:
        return known
    return None if _IDENTIFIER.fullmatch(value) is None else _remember(_identifiers, value, value)


def _instant_us(value: object, remember: bool = True) -> int | None:
    """Epoch microseconds of an RFC 3339 time with a zone (``Z`` or ``±hh:mm``), seconds and up to 6 decimals.
    ``remember``: keep it for the next time it comes (window bounds come again; send times hardly ever)."""
    if type(value) is not str:
        return None
    known = _instants.get(value)
    if known is not None:
        return known
    if _INSTANT.fullmatch(value) is None or not 1000 <= int(value[:4]) <= 9998:  # far from datetime's limits
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:  # a day or hour that does not exist, an offset past 24 h
        return None
    micros = to_micros(moment)
    return _remember(_instants, value, micros) if remember else micros


def _model_version(value: object) -> str | None:
    """``Prediction.model_version``: 1 to 64 characters (ASCII here; anything else takes the slow path)."""
    if type(value) is not str:
        return None
    known = _versions.get(value)
    if known is not None:
        return known
    return _remember(_versions, value, value) if 1 <= len(value) <= 64 and value.isascii() else None


def _probability(value: object) -> float | None:
    # Not bool, not str (pydantic's other spellings take the slow path); NaN fails the range.
    if (type(value) is float or type(value) is int) and 0.0 <= value <= 1.0:
        return float(value)
    return None


def prediction_tuple(value: bytes, partition: int, offset: int) -> tuple[Any, ...] | None:
    """``tuple(prediction_record(Prediction.model_validate_json(value), ...))`` for a prediction in the plain form an
    edge's encoder writes; None where this cannot tell cheaply (then validate with pydantic)."""
    try:
        data = from_json(value, allow_inf_nan=False)  # pydantic's own JSON parser: the same reading of the bytes
    except ValueError:
        return None
    if type(data) is not dict or not data.keys() <= _PREDICTION_KEYS or data.get("reasons") is not None:
        return None
    try:
        return _plain_prediction(data, partition, offset)
    except KeyError:  # a required field is missing
        return None


def _plain_prediction(data: dict[str, Any], partition: int, offset: int) -> tuple[Any, ...] | None:
    version = data.get("schema_version", 1)
    if type(version) is not int or version != 1:
        return None
    seq = data["seq"]
    if type(seq) is not int or not 0 <= seq <= _MAX_COUNT:
        return None
    horizon = data["horizon_h"]
    if (type(horizon) is not float and type(horizon) is not int) or not 0 < horizon <= _MAX_HORIZON_H:
        return None
    threshold = data.get("threshold")
    if threshold is not None and (threshold := _probability(threshold)) is None:
        return None
    model_version = _model_version(data["model_version"])
    edge_id = _identifier(data["edge_id"])
    machine_id = _identifier(data["machine_id"])
    model_name = _identifier(data["model_name"])
    start = _instant_us(data["window_start"])
    end = _instant_us(data["window_end"])
    emitted = _instant_us(data["emitted_at"], remember=False)
    if None in (model_version, edge_id, machine_id, model_name, start, end, emitted) or end < start:  # type: ignore[operator]
        return None
    risk = data["risk"]
    if type(risk) is not dict or not risk:
        return None
    pairs = []
    for kind, p in risk.items():
        kind, p = _identifier(kind), _probability(p)
        if kind is None or p is None:
            return None
        pairs.append((kind, p))
    pairs.sort()
    return (edge_id, seq, machine_id, start, end, float(horizon), tuple(pairs), model_name, model_version, emitted,
            partition, offset, threshold, None)  # fmt: skip


FROM_BYTES: dict[Callable[..., tuple[Any, ...]], Callable[[bytes, int, int], tuple[Any, ...] | None]] = {
    prediction_record: prediction_tuple,
}
"""A record maker -> the function that reads the same record tuple straight from a message's bytes when it can
(None where it cannot: then the message is validated by its contract and made into a record as before)."""
