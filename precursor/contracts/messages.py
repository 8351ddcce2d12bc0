"""Message schemas: JSON on the wire, validated by pydantic v2, each with a schema version.

Every message an edge sends carries ``(edge_id, seq)``: ``seq`` rises by one per message per edge, so a consumer that
keeps the pair as a key drops a retried send instead of counting it twice.

>>> p = Prediction(edge_id="edge-1", seq=7, machine_id="pump-3",
...                window_start="2026-01-01T00:00:00Z", window_end="2026-01-01T01:00:00Z",
...                horizon_h=24, risk={"failure": 0.25}, model_name="zscore", model_version="0.1.0")
>>> decode(Prediction, encode(p)) == p
True
>>> p.max_risk
0.25
>>> decode(Prediction, b'{"edge_id": "edge-1"}')
Traceback (most recent call last):
...
precursor.contracts.messages.ContractError: Prediction: seq is missing; machine_id is missing; ...
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    ValidationError,
    field_validator,
    model_validator,
)

from precursor.contracts.alerting import Probability

SCHEMA_VERSION = 1

Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")]
SensorName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
"""A non-negative integer that fits the store's 64-bit columns: a larger one would pass validation and then fail the
store write, stopping ingest at that record on every run."""


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware instant, normalised to UTC. Naive times are refused: an edge box's local clock is ambiguous."""

_DETAIL = r"[A-Za-z0-9_.\-]+"
EVENT_PATTERN = re.compile(rf"^(failure(:{_DETAIL})?|maintenance:{_DETAIL}|error:{_DETAIL}|anomaly)$")


class ContractError(ValueError):
    """A message that does not match its contract. The text names each bad field and the value it had."""


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION


class EdgeMessage(Message):
    """Anything an edge agent sends. ``(edge_id, seq)`` is the idempotency key."""

    edge_id: Identifier
    seq: Count


class TelemetryReading(Message):
    """One row of telemetry: a machine's sensor values at one instant. ``None`` is a missing reading."""

    timestamp: UtcDatetime
    machine_id: Identifier
    values: dict[SensorName, float | None] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        bad = [name for name, v in values.items() if v is not None and not math.isfinite(v)]
        if bad:
            raise ValueError(f"sensor values must be finite numbers or null; not finite: {', '.join(sorted(bad))}")
        return values


class Event(Message):
    """Something that happened to a machine: ``failure[:KIND]``, ``maintenance:PART``, ``error:CODE`` or ``anomaly``."""

    timestamp: UtcDatetime
    machine_id: Identifier
    event: Annotated[str, Field(pattern=EVENT_PATTERN.pattern)]

    @property
    def kind(self) -> str:
        """``failure``, ``maintenance``, ``error`` or ``anomaly``."""
        return event_kind(self.event)

    @property
    def detail(self) -> str | None:
        """The failure kind, the part maintained or the error code; ``None`` where the event has none."""
        return event_detail(self.event)


def event_kind(event: str) -> str:
    """An event text's kind: ``failure``, ``maintenance``, ``error`` or ``anomaly``.

    >>> event_kind("error:E310"), event_detail("error:E310"), event_detail("anomaly")
    ('error', 'E310', None)
    """
    return event.split(":", 1)[0]


def event_detail(event: str) -> str | None:
    """An event text's detail (the failure kind, the part maintained or the error code), or ``None``."""
    parts = event.split(":", 1)
    return parts[1] if len(parts) == 2 else None


class EdgeEvent(EdgeMessage, Event):
    """An event as an edge saw it and sent it to ``precursor.events``."""


MAX_REASONS = 8
"""The most reasons a prediction carries: the few that moved its risk most, so a message stays small."""

ShortText = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ReasonDetail(BaseModel):
    """Where in the window a reason lies: the statistic and block of a sensor, or how often and how long ago an event
    came. ``from_h``/``to_h``: the hours before the window's end that the evidence spans (``to_h`` 0: up to the end)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    statistic: Annotated[str, Field(pattern=r"^[a-z][a-z_]{0,15}$")] | None = None
    block: Annotated[int, Field(ge=0, le=63)] | None = None
    from_h: Annotated[float, Field(ge=0, le=24 * 365, allow_inf_nan=False)] | None = None
    to_h: Annotated[float, Field(ge=0, le=24 * 365, allow_inf_nan=False)] | None = None
    count: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    age_h: Annotated[float, Field(ge=0, le=24 * 365 * 100, allow_inf_nan=False)] | None = None


class Reason(BaseModel):
    """One piece of a window's context that raised its risk, and by how much: the risk fell by ``risk_drop`` when
    the model scored the window without it (occlusion, :mod:`models.edge.explain`). ``text`` says it in words."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sensor", "event", "context"]
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")] = Field(
        description="the sensor, the event (error:E310, maintenance:bearing, failure) or the context (an attribute)"
    )
    risk_drop: Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False)]
    detail: ReasonDetail | None = None
    text: ShortText


class Prediction(EdgeMessage):
    """A risk estimate for one machine over one window: the probability of each failure kind within the horizon.

    ``reasons``, where the edge explained the prediction (alerting windows of a model that can be explained): what
    moved the risk most, largest first. Predictions without them (older edges, baselines, quiet windows) stay valid.
    """

    machine_id: Identifier
    window_start: UtcDatetime
    window_end: UtcDatetime
    horizon_h: Annotated[float, Field(gt=0, le=24 * 365, allow_inf_nan=False)]
    risk: dict[Identifier, Probability] = Field(min_length=1)
    model_name: Identifier
    model_version: Annotated[str, Field(min_length=1, max_length=64)]
    emitted_at: UtcDatetime = Field(default_factory=lambda: datetime.now(UTC))
    threshold: Probability | None = Field(
        default=None,
        description="The model's own alert threshold (chosen on its validation data), when it has one: monitoring "
        "judges each model version at its own threshold, not at one shared figure.",
    )
    reasons: list[Reason] | None = Field(default=None, max_length=MAX_REASONS)

    @field_validator("window_end")
    @classmethod
    def _window_order(cls, end: datetime, info: Any) -> datetime:
        start = info.data.get("window_start")
        if start is not None and end < start:
            raise ValueError(f"window_end {end.isoformat()} is before window_start {start.isoformat()}")
        return end

    @property
    def max_risk(self) -> float:
        """The highest risk over all failure kinds: what "at risk" sorts by."""
        return max(self.risk.values())


MAX_SUMMARY_SENSORS = 1024
"""The most sensors one telemetry summary carries (about 100 bytes each); a machine with more sends several."""
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class SensorSummary(BaseModel):
    """One sensor over one period: the mean, lowest, highest and last of its ``count`` readings (missing ones left
    out, so ``count`` is at least one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: FiniteFloat
    min: FiniteFloat
    max: FiniteFloat
    last: FiniteFloat
    count: Annotated[int, Field(ge=1, le=2**31 - 1)]

    @model_validator(mode="after")
    def _ordered(self) -> SensorSummary:
        if not self.min <= self.mean <= self.max or not self.min <= self.last <= self.max:
            shown = f"min={self.min}, mean={self.mean}, last={self.last}, max={self.max}"
            raise ValueError(f"mean and last must lie between min and max ({shown})")
        return self


class TelemetrySummary(EdgeMessage):
    """What one machine's sensors did over one period ``[window_start, window_end)``, sent to
    ``precursor.telemetry`` by an edge that opts in; the raw readings stay at the edge. ``readings``: how many
    readings the period held (a sensor's ``count`` is how many of them had a value for it)."""

    machine_id: Identifier
    window_start: UtcDatetime
    window_end: UtcDatetime
    readings: Annotated[int, Field(ge=1, le=2**31 - 1)]
    sensors: dict[SensorName, SensorSummary] = Field(min_length=1, max_length=MAX_SUMMARY_SENSORS)

    @field_validator("window_end")
    @classmethod
    def _after_start(cls, end: datetime, info: Any) -> datetime:
        start = info.data.get("window_start")
        if start is not None and end <= start:
            raise ValueError(f"window_end {end.isoformat()} is not after window_start {start.isoformat()}")
        return end

    @model_validator(mode="after")
    def _counts_fit(self) -> TelemetrySummary:
        over = sorted(name for name, s in self.sensors.items() if s.count > self.readings)
        if over:
            raise ValueError(f"sensors counted more values than the {self.readings} readings: {', '.join(over)}")
        return self


class AgentBuild(BaseModel):
    """Which edge agent code sent a message: the package version and a hash of the agent's own source files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[str, Field(min_length=1, max_length=64)]
    sha256: Sha256Hex


class HeartbeatSignature(BaseModel):
    """The edge's ed25519 signature over :meth:`Heartbeat.statement`, and the id of the key that made it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: Identifier
    value: Annotated[str, Field(min_length=1, max_length=256, description="base64 ed25519 signature")]


HEARTBEAT_STATEMENT = "precursor.heartbeat"

Rate = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
"""Items per second: bounded so a hostile heartbeat cannot carry a figure no chart or sum can hold."""
Seconds = Annotated[float, Field(ge=0, le=1e10, allow_inf_nan=False)]
Millis = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]


class EdgeFlow(BaseModel):
    """What went through an edge: rates over the ``interval_s`` before the heartbeat, and running totals (CPU,
    predictions, energy) since the agent started, from which cost per prediction follows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: Seconds = Field(description="the time the rates cover: since the previous heartbeat")
    readings_per_s: Rate = 0.0
    windows_per_s: Rate = 0.0
    predictions_per_s: Rate = 0.0
    scoring_ms_p50: Millis | None = Field(None, description="per window, over the interval; None: nothing scored")
    scoring_ms_p95: Millis | None = None
    scoring_busy: Annotated[float, Field(ge=0, le=1e3, allow_inf_nan=False)] = Field(
        0.0, description="seconds spent scoring per second of the interval (1.0: the scorer never rests)"
    )
    cpu_s: Seconds = Field(0.0, description="CPU seconds the agent process used since it started")
    scoring_cpu_s: Seconds = Field(0.0, description="of those, CPU seconds spent scoring windows")
    predictions: Count = Field(0, description="predictions made since the agent started")
    energy_j: Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)] | None = Field(
        None, description="joules the CPU package used since the agent started (RAPL), where the edge exposes them"
    )


class Heartbeat(EdgeMessage):
    """An edge agent's periodic health report, keyed by edge_id.

    Schema version 2 adds who sent it: the agent's build and, from an enrolled edge, a signature by the edge's own key
    over the whole heartbeat (:meth:`statement`), and optionally what flowed through the edge (:class:`EdgeFlow`,
    signed with the rest). Version 1 heartbeats (none of these) still parse: they read as unsigned.
    """

    schema_version: Literal[1, 2] = 2  # type: ignore[assignment]
    timestamp: UtcDatetime
    model_name: Identifier
    model_version: Annotated[str, Field(min_length=1, max_length=64)]
    model_sha256: Sha256Hex | None = None
    outbox_depth: Count = 0
    lag_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    health: Literal["ok", "degraded", "failing"] = "ok"
    machines: Count = 0
    agent: AgentBuild | None = None
    signature: HeartbeatSignature | None = None
    flow: EdgeFlow | None = Field(None, description="throughput, scoring time and CPU; covered by the signature")

    @model_validator(mode="after")
    def _identity_needs_version_2(self) -> Heartbeat:
        if self.schema_version == 1 and (self.agent is not None or self.signature is not None or self.flow is not None):
            raise ValueError("agent, signature and flow came with schema_version 2; this heartbeat says 1")
        return self

    def statement(self) -> bytes:
        """The bytes an edge signs: every field but the signature's value, as canonical JSON (sorted keys, no
        spaces, UTF-8), plus a ``statement`` tag so the signature cannot pass for one over any other kind of data.

        Fields left at None are left out, so a field added later (it must default to None) does not change what an
        older agent signed.
        """
        fields = self.model_dump(mode="json", exclude={"signature": {"value"}}, exclude_none=True)
        fields["statement"] = HEARTBEAT_STATEMENT
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


Ed25519PublicKeyB64 = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{43}=$")]
"""The 32 raw bytes of an ed25519 public key, base64."""
SignatureB64 = Annotated[str, Field(min_length=1, max_length=128)]
"""A base64 ed25519 signature (88 characters); the bound keeps a hostile record from carrying megabytes here."""


class KeySignature(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: Identifier
    signature: SignatureB64


class KeyRotation(BaseModel):
    """Which keys sign releases from now on: trust version ``version``, signed by ``threshold`` keys of the trust
    before it and by ``threshold`` of its own keys. A key left out is revoked (see :mod:`models.edge.releases`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[int, Field(ge=1, le=1_000_000)]
    keys: dict[Identifier, Ed25519PublicKeyB64] = Field(min_length=1, max_length=32)
    threshold: Annotated[int, Field(ge=1, le=32)] = 1
    issued_at: UtcDatetime
    signatures: list[KeySignature] = Field(default_factory=list, max_length=64)


class ModelRelease(Message):
    """A model published to the fleet, in a message signed as a whole by a release key.

    ``signature`` and ``key_id`` are the artifact manifest's; ``release_signature`` by ``release_key_id`` covers every
    other field of this message (:func:`models.edge.releases.release_statement`), so the target, the version, the
    artifact's location, when it was issued and when it expires cannot be changed or replayed elsewhere. ``keyring``
    carries the key rotations since the edges' configured keys, so an edge that missed one still follows.
    """

    version: Annotated[str, Field(min_length=1, max_length=64)]
    model_name: Identifier
    sha256: Sha256Hex
    signature: Annotated[
        str, Field(min_length=1, max_length=128, description="base64 ed25519 signature of the artifact manifest")
    ]
    key_id: Identifier
    size_bytes: NonNegativeInt
    artifact_uri: Annotated[str, Field(min_length=1, max_length=4096)]
    target: Identifier = "fleet"
    canary_edges: list[Identifier] = Field(default_factory=list, max_length=10_000)
    released_at: UtcDatetime = Field(
        default_factory=lambda: datetime.now(UTC), description="when the release was issued: its order per target"
    )
    expires_at: UtcDatetime | None = Field(
        None, description="after this the release is stale and refused (a frozen feed cannot hold an edge back)"
    )
    rollback: bool = Field(False, description="a deliberate return to a lower version: the only way an edge takes one")
    keyring: list[KeyRotation] = Field(default_factory=list, max_length=64)
    release_key_id: Identifier | None = None
    release_signature: SignatureB64 | None = None


class Alert(Message):
    """Raised (or cleared) by the pipelines when a machine's risk crosses the alert thresholds."""

    machine_id: Identifier
    state: Literal["raised", "cleared"]
    kind: Identifier
    risk: Probability
    at: UtcDatetime
    model_version: Annotated[str, Field(min_length=1, max_length=64)]


MAX_DEAD_LETTER_RAW_BYTES = 256 * 1024
"""The most raw bytes a dead letter carries. A record of any size must become a dead letter that the producer can send
(1 MB by default, and base64 adds a third): a larger one is cut, and its size and hash say what it was."""
MAX_REASON_CHARS = 4096
MAX_KEY_CHARS = 1024


def _cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters long, saying how much was left out.

    >>> _cut("abcdef", 10)
    'abcdef'
    >>> _cut("x" * 100, 40)
    'xxxxxxxxxxxxxxxxx… (83 more characters)'
    """
    if len(text) <= limit:
        return text
    room = limit - len(f"… ({len(text)} more characters)")
    return text[:room] + f"… ({len(text) - room} more characters)"


class DeadLetter(Message):
    """A record a consumer could not accept: its raw bytes (base64, cut to ``MAX_DEAD_LETTER_RAW_BYTES``) with their
    full size and SHA-256, and why, so nothing is silently lost and a dead letter always fits on its topic."""

    source_topic: str
    partition: NonNegativeInt | None = None
    offset: NonNegativeInt | None = None
    key: Annotated[str | None, Field(max_length=MAX_KEY_CHARS)] = None
    raw_b64: str
    raw_size: NonNegativeInt | None = Field(default=None, description="the raw record's size in bytes")
    raw_sha256: Sha256Hex | None = Field(default=None, description="SHA-256 of the whole raw record")
    truncated: bool = Field(default=False, description="raw_b64 holds only the first MAX_DEAD_LETTER_RAW_BYTES")
    reason: Annotated[str, Field(min_length=1, max_length=MAX_REASON_CHARS)]
    at: UtcDatetime = Field(default_factory=lambda: datetime.now(UTC))

    @classmethod
    def of(
        cls,
        raw: bytes | None,
        reason: str,
        *,
        source_topic: str,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
    ) -> DeadLetter:
        """A dead letter for ``raw`` of any size, with a key and reason of any length.

        >>> letter = DeadLetter.of(b"x" * 300_000, "not valid JSON", source_topic="t")
        >>> letter.truncated, letter.raw_size, len(base64.b64decode(letter.raw_b64)) == MAX_DEAD_LETTER_RAW_BYTES
        (True, 300000, True)
        """
        raw = raw or b""
        shown = raw[:MAX_DEAD_LETTER_RAW_BYTES]
        return cls(
            source_topic=source_topic,
            partition=partition,
            offset=offset,
            key=_cut(key.decode("utf-8", "replace"), MAX_KEY_CHARS) if key else None,
            raw_b64=base64.b64encode(shown).decode(),
            raw_size=len(raw),
            raw_sha256=hashlib.sha256(raw).hexdigest(),
            truncated=len(shown) < len(raw),
            reason=_cut(reason, MAX_REASON_CHARS) or "no reason given",
        )


M = TypeVar("M", bound=Message)

_MAX_VALUE_CHARS = 60


def _describe(err: ValidationError, model: type[BaseModel]) -> str:
    parts: list[str] = []
    for e in err.errors(include_url=False):
        field = ".".join(str(p) for p in e["loc"]) or "message"
        if e["type"] == "missing":
            parts.append(f"{field} is missing")
            continue
        parts.append(f"{field}={_show(e.get('input'))}: {e['msg']}")
    return _cut(f"{model.__name__}: " + "; ".join(parts), MAX_REASON_CHARS)


def _show(value: Any) -> str:
    """A short picture of a bad value, whatever it is: an int past Python's digit limit or a structure nested past
    the recursion limit has no repr, and a huge one must not make a huge reason."""
    if isinstance(value, str | bytes) and len(value) > _MAX_VALUE_CHARS:
        value = value[:_MAX_VALUE_CHARS]
    try:
        shown = repr(value)
    except (ValueError, RecursionError):
        shown = f"<{type(value).__name__} too large to show>"
    if len(shown) > _MAX_VALUE_CHARS:
        shown = shown[: _MAX_VALUE_CHARS - 3] + "..."
    return shown


def validate(model: type[M], data: Any) -> M:
    """Build ``model`` from a dict, or raise :class:`ContractError` naming every bad field and its value."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ContractError(_describe(err, model)) from None
    except RecursionError:
        raise ContractError(f"{model.__name__}: nested too deeply") from None


def decode(model: type[M], raw: bytes | str) -> M:
    """Parse one JSON message, or raise :class:`ContractError` naming what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        # ValueError covers bad UTF-8, bad JSON and integers past Python's digit limit; RecursionError, nesting.
        raise ContractError(f"{model.__name__}: not valid JSON ({_cut(str(err), 200)})") from None
    if not isinstance(data, dict):
        raise ContractError(f"{model.__name__}: expected a JSON object, got {type(data).__name__}")
    return validate(model, data)


def encode(message: Message) -> bytes:
    """The wire form: compact UTF-8 JSON."""
    return message.model_dump_json().encode()
