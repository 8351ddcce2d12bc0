"""The edge agent's configuration: one YAML file, validated at start with errors that name the bad key.

Example::

    edge_id: plant-7-gw-1
    kafka:
      bootstrap_servers: localhost:9092
    sources:
      - type: replay
        telemetry: data/telemetry.csv
        events: data/events.csv
    window: {length: 6h, every: 1h}
    model: {type: drift-zscore, horizon: 24h}
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.durations import Duration
from contracts.messages import Identifier
from contracts.settings import KafkaSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplaySource(_Strict):
    """Replays generic-format files (CSV, JSONL, Parquet); ``speedup`` 0 means as fast as possible."""

    type: Literal["replay"] = "replay"
    telemetry: Path
    events: Path | None = None
    machines: Path | None = None
    speedup: Annotated[float, Field(ge=0)] = 0.0


class SimulatorSource(_Strict):
    """The built-in fleet simulator as a live source, at an accelerated clock."""

    type: Literal["simulator"] = "simulator"
    machines: Annotated[int, Field(gt=0)] = 10
    duration: Duration | None = Field(None, description="simulated time to run; empty = forever")
    interval: Duration = timedelta(minutes=10)
    seed: int = 0
    speedup: Annotated[float, Field(ge=0)] = 3600.0
    kinds: list[str] | None = None


Source = Annotated[ReplaySource | SimulatorSource, Field(discriminator="type")]


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


class ModelSpec(_Strict):
    """Which scorer runs: the telemetry language model (``lm``) or the drift baseline (``drift-zscore``)."""

    type: Literal["lm", "drift-zscore"] = "drift-zscore"
    artifact: Path | None = Field(None, description="signed model artifact folder (type lm)")
    trusted_keys: list[Path] = Field(default_factory=list, description="ed25519 public keys that may sign models")
    horizon: Duration = timedelta(hours=24)
    threads: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _lm_needs_artifact(self) -> ModelSpec:
        if self.type == "lm" and (self.artifact is None or not self.trusted_keys):
            raise ValueError("model type lm needs `artifact` and at least one entry in `trusted_keys`")
        return self


class EdgeConfig(_Strict):
    edge_id: Identifier
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    sources: list[Source] = Field(min_length=1)
    window: WindowSpec = Field(default_factory=WindowSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    state_dir: Path = Path(".state/edge")
    publish_events: bool = True

    @classmethod
    def load(cls, path: str | Path) -> EdgeConfig:
        """Read and validate a YAML config; paths in it are relative to the file's folder."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
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
                f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']} (got {e.get('input')!r:.60})"
                for e in err.errors(include_url=False)
            ]
            raise ConfigError(f"{source}: invalid edge config\n" + "\n".join(lines)) from None
        return config._relative_to(base)

    def _relative_to(self, base: Path) -> EdgeConfig:
        def fix(p: Path | None) -> Path | None:
            return p if p is None or p.is_absolute() else base / p

        sources = [
            s.model_copy(update={"telemetry": fix(s.telemetry), "events": fix(s.events), "machines": fix(s.machines)})
            if isinstance(s, ReplaySource)
            else s
            for s in self.sources
        ]
        model = self.model.model_copy(
            update={"artifact": fix(self.model.artifact), "trusted_keys": [fix(k) for k in self.model.trusted_keys]}
        )
        return self.model_copy(update={"sources": sources, "model": model, "state_dir": fix(self.state_dir)})


class ConfigError(ValueError):
    """The config file is missing, not YAML, or has invalid settings; the text lists each one."""
