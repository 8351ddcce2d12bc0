"""The edge agent's configuration: one YAML file, validated at start with errors that name the bad key.

Example (every section but ``edge_id`` and ``sources`` has defaults; relative paths are relative to the file)::

    edge_id: plant-7-gw-1
    kafka:
      bootstrap_servers: broker-1:9093
    sources:
      - type: tail                      # a growing CSV or JSONL file, rotation-safe
        path: /var/log/plc/telemetry.csv
      - type: mqtt                      # a real MQTT broker, QoS 1, acknowledged only once durable
        host: localhost
        topics: [plant7/telemetry/#]
      - type: replay                    # CSV, JSONL or Parquet files, with their events
        telemetry: data/telemetry.csv
        events: data/events.csv
    window: {length: 6h, every: 1h}
    model:
      type: lm
      artifact: models/precursor-lm-0.3.0
      trusted_keys: [keys/release.pub]
    outbox: {max_bytes: 512MiB}
    health: {port: 9308}
    telemetry_summaries: {enabled: true}  # per-sensor mean, min, max, last to <prefix>.telemetry (off by default)
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    model_validator,
)

from precursor.contracts.durations import Duration
from precursor.contracts.messages import Identifier
from precursor.contracts.settings import KafkaSettings, PrecursorSettings

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: str | int) -> int:
    """Bytes from ``512MiB``, ``2GB``, ``4096`` (a bare number is bytes).

    >>> parse_size("512MiB"), parse_size("1.5kB"), parse_size(7)
    (536870912, 1500, 7)
    >>> parse_size("lots")
    Traceback (most recent call last):
    ...
    ValueError: size 'lots' is not a number of bytes, optionally with a unit (e.g. 512MiB, 2GB)
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"size {value!r} is not a number of bytes, optionally with a unit (e.g. 512MiB, 2GB)")
    return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])


ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SourceName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@\-]*$")]


class ReplaySource(_Strict):
    """Replays generic-format files (CSV, JSONL, Parquet); ``speedup`` 0 means as fast as possible.

    The position (items replayed so far) is saved with every commit, so a restart continues where it stopped and a
    finished replay is not replayed again.
    """

    type: Literal["replay"] = "replay"
    name: SourceName | None = None
    telemetry: Path
    events: Path | None = None
    machines: Path | None = None
    speedup: Annotated[float, Field(ge=0)] = 0.0
    batch_rows: Annotated[int, Field(ge=1, le=100_000)] = 256


class TailSource(_Strict):
    """Follows a growing CSV (with a header line) or JSONL file, through renames and truncation (log rotation).

    The file offset is saved in the same transaction as the predictions the lines led to, so a restart neither skips
    nor repeats a line. ``start`` says where to begin when nothing was saved yet.
    """

    type: Literal["tail"] = "tail"
    name: SourceName | None = None
    path: Path
    format: Literal["csv", "jsonl"] | None = Field(None, description="default: from the file name's suffix")
    start: Literal["beginning", "end"] = "beginning"
    poll: Duration = timedelta(milliseconds=200)
    machines: Path | None = Field(None, description="optional machines file (static attributes)")
    batch_rows: Annotated[int, Field(ge=1, le=100_000)] = 512


class MqttSource(_Strict):
    """Subscribes to an MQTT broker with QoS 1 and a persistent session (MQTT 5).

    Each message is a JSON object (one reading or event in the generic format) or a JSON array of them. A message is
    acknowledged (PUBACK) only after what it led to is committed to the outbox; the broker redelivers anything
    unacknowledged after a crash, and the window builder drops readings it already holds.
    """

    model_config = ConfigDict(hide_input_in_errors=True)  # a validation error prints no password

    type: Literal["mqtt"] = "mqtt"
    name: SourceName | None = None
    host: str = "localhost"
    port: Annotated[int, Field(ge=1, le=65535)] = 1883
    topics: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    client_id: str | None = Field(None, description="default: precursor-edge-<edge_id>; must be stable")
    username: str | None = None
    password: SecretStr | None = Field(None, description="a secret: never printed, logged or put in a repr")
    tls: bool = Field(False, description="TLS; the broker's certificate is checked against ca_file or the system CAs")
    ca_file: Path | None = None
    cert_file: Path | None = Field(None, description="client certificate (PEM), for brokers that require one")
    key_file: Path | None = Field(None, description="its private key (PEM, unencrypted)")
    keepalive: Annotated[int, Field(ge=5, le=3600)] = 30
    receive_maximum: Annotated[int, Field(ge=1, le=65535)] = 2000
    session_expiry: Duration = timedelta(days=7)
    machines: Path | None = Field(None, description="optional machines file (static attributes)")

    @model_validator(mode="after")
    def _tls_complete(self) -> MqttSource:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both for a client certificate, or neither")
        files = [name for name in ("ca_file", "cert_file") if getattr(self, name) is not None]
        if files and not self.tls:
            raise ValueError(f"{' and '.join(files)} take effect only with tls: true; set it")
        if self.password is not None and not self.username:
            raise ValueError("password needs username")
        return self


class SimulatorSource(_Strict):
    """The built-in fleet simulator as a live source, at an accelerated clock."""

    type: Literal["simulator"] = "simulator"
    name: SourceName | None = None
    machines: Annotated[int, Field(gt=0)] = 10
    duration: Duration | None = Field(None, description="simulated time to run; empty = forever")
    interval: Duration = timedelta(minutes=10)
    seed: int = 0
    speedup: Annotated[float, Field(ge=0)] = 3600.0
    kinds: list[str] | None = None
    batch_rows: Annotated[int, Field(ge=1, le=100_000)] = 256
    machine_prefix: str = Field(
        "m",
        pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,40}$",
        description="machine ids are <prefix>-NNNNN: edges simulating fleets of their own need distinct ones",
    )


def _source_type(value: Any) -> str | None:
    """The ``type`` of a source; one with ``telemetry`` files and no type is a replay (as in earlier configs)."""
    if isinstance(value, dict):
        return value.get("type", "replay" if "telemetry" in value else None)
    return getattr(value, "type", None)


Source = Annotated[
    Annotated[ReplaySource, Tag("replay")]
    | Annotated[TailSource, Tag("tail")]
    | Annotated[MqttSource, Tag("mqtt")]
    | Annotated[SimulatorSource, Tag("simulator")],
    Discriminator(_source_type),
]


def source_name(spec: Source) -> str:
    """The key a source's saved position is stored under: its ``name``, else derived from what it reads."""
    if spec.name:
        return spec.name
    if isinstance(spec, ReplaySource):
        return f"replay:{spec.telemetry}"
    if isinstance(spec, TailSource):
        return f"tail:{spec.path}"
    if isinstance(spec, MqttSource):
        return f"mqtt:{spec.host}:{spec.port}/{','.join(spec.topics)}"
    return f"simulator:{spec.seed}:{spec.machines}"


class WindowSpec(_Strict):
    """A window of ``length`` is scored every ``every`` of event time, per machine."""

    length: Duration = timedelta(hours=6)
    every: Duration = timedelta(hours=1)
    min_points: Annotated[int, Field(ge=1)] = 3
    event_lookback: Duration = timedelta(days=30)

    @model_validator(mode="after")
    def _positive(self) -> WindowSpec:
        if self.length <= timedelta(0) or self.every <= timedelta(0):
            raise ValueError("window length and every must be positive durations")
        return self


class TelemetrySummarySpec(_Strict):
    """Per-sensor summaries of each machine's readings (mean, min, max, last value and count per period) sent to
    ``<prefix>.telemetry``, for the dashboard's sensor lines. Off unless turned on; the raw readings stay at the edge
    either way.

    Periods lie on multiples of ``interval`` since the epoch, so a machine sends at most one summary per interval.
    ``interval`` defaults to ``window.every``; it must be a whole multiple of it and at most ``window.length`` (the
    edge holds no reading older than one window, and a summary counts every reading of its period, each reading in
    one summary).
    """

    enabled: bool = False
    interval: Duration | None = Field(None, description="one summary per machine per interval; default window.every")


class ModelSpec(_Strict):
    """Which scorer runs first: the telemetry language model (``lm``) or the drift baseline (``drift-zscore``).

    After a model update the agent runs the updated model (kept under ``state_dir/models``), also after a restart.
    """

    type: Literal["lm", "drift-zscore"] = "drift-zscore"
    artifact: Path | None = Field(None, description="signed model artifact folder (type lm)")
    trusted_keys: list[Path] = Field(
        default_factory=list, description="ed25519 public keys (.pub files, or folders of them) that may sign models"
    )
    horizon: Duration = timedelta(hours=24)
    threads: Annotated[int, Field(ge=1)] = 1
    max_batch: Annotated[int, Field(ge=1, le=4096)] = Field(
        16, description="windows scored (and committed) together: small keeps a burst's latency low"
    )

    @model_validator(mode="after")
    def _lm_needs_artifact(self) -> ModelSpec:
        if self.type == "lm" and (self.artifact is None or not self.trusted_keys):
            raise ValueError("model type lm needs `artifact` and at least one entry in `trusted_keys`")
        return self


class ExplainSpec(_Strict):
    """Why each alerting prediction: the context that moved its risk most, by occlusion on the running model
    (:mod:`models.edge.explain`), sent in the prediction's ``reasons``. Only windows at or above the alert threshold are
    explained, so the cost follows the alert rate; models that cannot be explained (the baseline) send none."""

    enabled: bool = True
    threshold: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="explain windows at or above this risk; default: the model's own alert threshold"
    )
    max_reasons: Annotated[int, Field(ge=1, le=8)] = 3
    min_log_odds_drop: Annotated[float, Field(ge=0, le=20)] = Field(
        0.1, description="a piece of context whose removal lowers the risk's log-odds by less is no reason"
    )
    max_sensors: Annotated[int, Field(ge=1, le=1024)] = Field(
        32, description="sensors tried per window; more are ranked by how far their readings lie from the middle"
    )


class SelfTestSpec(_Strict):
    """What a new model must show on the agent's recent windows before it replaces the running one."""

    windows: Annotated[int, Field(ge=1, le=4096)] = 64
    min_sensor_coverage: Annotated[float, Field(ge=0, le=1)] = 0.5
    max_ms_per_window: Annotated[float, Field(gt=0)] = 250.0


class UpdatesSpec(_Strict):
    """Over-the-air model updates from ``<prefix>.model-updates``."""

    enabled: bool = True
    targets: list[Identifier] = Field(default_factory=lambda: ["fleet"], description="release targets this edge takes")
    max_bytes: ByteSize = 512 * 2**20
    poll: Duration = timedelta(milliseconds=500)
    self_test: SelfTestSpec = Field(default_factory=SelfTestSpec)


class OutboxSpec(_Strict):
    """The durable outbox: everything the agent sends is committed here first and deleted once Kafka acknowledged it.

    When queued messages reach ``max_bytes`` the oldest are dropped, lowest value first: telemetry summaries, then
    heartbeats, then predictions, then events (failures and maintenance are the labels retraining needs); each drop
    is counted.
    ``durability: process`` survives a crash of the agent; ``power`` also a power cut (an fsync per commit).
    """

    max_bytes: ByteSize = 256 * 2**20
    durability: Literal["process", "power"] = "process"
    commit_interval: Duration = timedelta(milliseconds=20)
    max_commit_items: Annotated[int, Field(ge=1)] = 2000
    send_batch: Annotated[int, Field(ge=1, le=100_000)] = 1000


class MachinePolicy(_Strict):
    """Which machines the agent accepts. With ``allow`` or ``file`` set, any other machine is quarantined;
    ``max`` bounds how many machines are tracked at once, so a flood of made-up ids cannot exhaust memory."""

    allow: list[Identifier] = Field(default_factory=list)
    file: Path | None = Field(None, description="a machines file; its machine_ids are allowed")
    max: Annotated[int, Field(ge=1)] = 100_000


class InputSpec(_Strict):
    """Limits on input: readings stamped further ahead of the edge's clock than ``max_future`` are quarantined."""

    max_future: Duration = timedelta(days=1)
    max_sensors: Annotated[int, Field(ge=1, le=10_000)] = 512
    max_record_bytes: Annotated[int, Field(ge=64)] = 64 * 1024


class HealthSpec(_Strict):
    """``/healthz`` and ``/metrics`` on a local port; ``port: 0`` picks a free one, ``enabled: false`` turns it off."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 9308


class HeartbeatSpec(_Strict):
    interval: Duration = timedelta(seconds=30)


class LogSpec(_Strict):
    format: Literal["json", "text"] = "json"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class QuarantineSpec(_Strict):
    """Bad input goes to ``state_dir/quarantine.jsonl``; at ``max_bytes`` it rotates to ``.1`` (one old file kept)."""

    max_bytes: ByteSize = 64 * 2**20


class EdgeConfig(_Strict):
    edge_id: Identifier
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    sources: list[Source] = Field(min_length=1)
    window: WindowSpec = Field(default_factory=WindowSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    explain: ExplainSpec = Field(default_factory=ExplainSpec)
    updates: UpdatesSpec = Field(default_factory=UpdatesSpec)
    outbox: OutboxSpec = Field(default_factory=OutboxSpec)
    machines: MachinePolicy = Field(default_factory=MachinePolicy)
    input: InputSpec = Field(default_factory=InputSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)
    log: LogSpec = Field(default_factory=LogSpec)
    quarantine: QuarantineSpec = Field(default_factory=QuarantineSpec)
    telemetry_summaries: TelemetrySummarySpec = Field(default_factory=TelemetrySummarySpec)
    state_dir: Path = Field(
        default_factory=lambda: _default_state_dir(),
        description="sequence numbers, outbox, quarantine, updated models; default <PRECURSOR_STATE_DIR>/edge "
        "(PRECURSOR_STATE_DIR is relative to the current folder), else .state/edge beside the config file",
    )
    publish_events: bool = True
    drain_timeout: Duration = Field(timedelta(seconds=10), description="on SIGTERM: how long to keep sending")
    exit_when_sources_end: bool = Field(True, description="stop once every source has ended (replays, finite sims)")

    @model_validator(mode="after")
    def _distinct_source_names(self) -> EdgeConfig:
        names = [source_name(s) for s in self.sources]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"sources must have distinct names (set `name:`); repeated: {', '.join(repeated)}")
        return self

    @model_validator(mode="after")
    def _summary_interval_fits_the_window(self) -> EdgeConfig:
        interval = self.telemetry_summaries.interval
        if interval is None:
            return self
        every, length = self.window.every, self.window.length
        if interval % every or interval > max(length, every):
            raise ValueError(
                f"telemetry_summaries.interval={interval} must be a whole multiple of window.every={every} and at "
                f"most window.length={length}: the edge holds no reading older than one window"
            )
        return self

    @property
    def summary_interval(self) -> timedelta | None:
        """How often each machine sends a telemetry summary; None when summaries are off."""
        spec = self.telemetry_summaries
        return (spec.interval or self.window.every) if spec.enabled else None

    @property
    def updates_active(self) -> bool:
        """Updates run only where some key may sign them."""
        return self.updates.enabled and bool(self.model.trusted_keys)

    @classmethod
    def load(cls, path: str | Path) -> EdgeConfig:
        """Read and validate a YAML config; paths in it are relative to the file's folder."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory, not a config file") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
        return cls.from_dict(data, base=path.parent, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, base: Path = Path("."), source: str = "config") -> EdgeConfig:
        try:
            config = cls.model_validate(data)
        except ValidationError as err:
            lines = [
                f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']} "
                f"(got {_redacted(e.get('input'), str(e['loc'][-1]) if e['loc'] else '')!r:.60})"
                for e in err.errors(include_url=False)
            ]
            raise ConfigError(f"{source}: invalid edge config\n" + "\n".join(lines)) from None
        kafka = data.get("kafka")
        return config._relative_to(base, kafka_keys=set(kafka) if isinstance(kafka, dict) else set())

    def _relative_to(self, base: Path, kafka_keys: set[str] | frozenset[str] = frozenset()) -> EdgeConfig:
        """Paths the file gave, relative to its folder (a Kafka path from a PRECURSOR_KAFKA_* variable stays as is)."""

        def fix(p: Path | None) -> Path | None:
            return p if p is None or p.is_absolute() else base / p

        def fix_source(s: Source) -> Source:
            paths = {
                name: fix(getattr(s, name))
                for name in ("telemetry", "events", "machines", "path", "ca_file", "cert_file", "key_file")
                if isinstance(getattr(s, name, None), Path)
            }
            return s.model_copy(update=paths)

        model = self.model.model_copy(
            update={"artifact": fix(self.model.artifact), "trusted_keys": [fix(k) for k in self.model.trusted_keys]}
        )
        machines = self.machines.model_copy(update={"file": fix(self.machines.file)})
        kafka_files = {
            name: str(fix(Path(value)))
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
            if name in kafka_keys and (value := getattr(self.kafka, name))
        }
        return self.model_copy(
            update={
                "kafka": self.kafka.model_copy(update=kafka_files),
                "sources": [fix_source(s) for s in self.sources],
                "model": model,
                "machines": machines,
                "state_dir": fix(self.state_dir),
            }
        )


def _default_state_dir() -> Path:
    state = PrecursorSettings()
    # An explicit PRECURSOR_STATE_DIR means the deployment's one state folder, as for the broker and the flows.
    return state.state_dir.absolute() / "edge" if "state_dir" in state.model_fields_set else Path(".state/edge")


def _redacted(value: Any, key: str = "") -> Any:
    """``value`` as a config error may show it: whatever sits under a password key is masked, however deep.

    >>> _redacted({"host": "h", "password": "hunter2", "kafka": {"sasl_plain_password": "x"}})
    {'host': 'h', 'password': '**********', 'kafka': {'sasl_plain_password': '**********'}}
    """
    if "password" in key.lower():
        return "**********"
    if isinstance(value, dict):
        return {k: _redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


class ConfigError(ValueError):
    """The config file is missing, not YAML, or has invalid settings; the text lists each one."""
