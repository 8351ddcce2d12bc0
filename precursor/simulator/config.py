"""What to simulate: one plain, frozen settings object. The same config always gives byte-identical output.

>>> config = FleetConfig(machines=3, duration="2d", interval="10m", seed=7, failure_kinds=["clog", "bearing"])
>>> config.failure_kinds
('bearing', 'clog')
>>> config.machine_ids
('m-001', 'm-002', 'm-003')
>>> config.samples_per_machine
288
>>> daily = FleetConfig(profile="daily", machines=4)
>>> daily.interval_s, daily.machines, daily.time_scale
(86400, 4, 8.0)
>>> FleetConfig(failure_kinds=["gremlins"])
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for FleetConfig
failure_kinds
  Value error, unknown failure kind 'gremlins'; known: bearing, overheat, seal_leak, electrical, clog ...
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from precursor.contracts.durations import Duration
from precursor.contracts.messages import UtcDatetime
from precursor.simulator.physics import FAILURE_KINDS
from precursor.simulator.profiles import profile_fields

DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)


class FleetConfig(BaseModel):
    """A simulated fleet: how many machines, over what time, how often they report, and how they fail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    machines: Annotated[int, Field(ge=1, le=100_000, description="number of machines")] = 10
    start: UtcDatetime = Field(DEFAULT_START, description="simulated time of the first reading (whole seconds)")
    duration: Duration | None = Field(
        timedelta(days=30), description="simulated time span; None runs forever (streaming only)"
    )
    interval: Duration = Field(timedelta(minutes=5), description="time between readings of one machine")
    seed: int = 0
    failure_kinds: tuple[str, ...] = Field(
        tuple(FAILURE_KINDS), description="failure kinds that can happen; others never do"
    )
    mtbf: Duration = Field(
        timedelta(days=10),
        description="mean time between onsets of failure-bound degradation per machine; maintenance prevents some",
    )
    maintenance_interval: Duration | None = Field(
        timedelta(days=7), description="mean time between routine maintenance visits; None for no routine visits"
    )
    false_alarm_ratio: Annotated[float, Field(ge=0, le=10)] = Field(
        0.4, description="degradations that recover on their own, per degradation that would end in failure"
    )
    sudden_fraction: Annotated[float, Field(ge=0, le=1)] = Field(
        0.1, description="share of failures that give only 0.5 to 3 hours of warning"
    )
    missing_rate: Annotated[float, Field(ge=0, lt=1)] = Field(0.01, description="share of sensor values left blank")
    noise: Annotated[float, Field(ge=0, le=10)] = Field(1.0, description="multiplier on measurement noise")
    background_errors_per_h: Annotated[float, Field(ge=0, le=60)] = Field(
        0.04, description="error codes per machine-hour unrelated to any failure"
    )
    upsets_per_day: Annotated[float, Field(ge=0, le=48)] = Field(
        0.3, description="short process upsets (a throttled valve) per machine-day; some are logged as anomalies"
    )
    machine_prefix: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,40}$")] = "m"
    profile: str | None = Field(
        None, description="a named kind of fleet (precursor.simulator.profiles); fields given explicitly win over it"
    )
    time_scale: Annotated[float, Field(gt=0, le=100)] = Field(
        1.0, description="multiplier on how long degradations build up and repairs take (error rates scale inversely)"
    )
    sensor_signature: Annotated[float, Field(ge=0, le=10)] = Field(
        1.0, description="multiplier on how strongly a degradation shows in the sensors (not in the error codes)"
    )
    error_rate_scale: Annotated[float, Field(ge=0, le=100)] = Field(
        1.0, description="multiplier on the error codes a degrading part raises"
    )
    error_burst: Annotated[float, Field(ge=0, le=50)] = Field(
        0.0, description="mean extra codes that follow a degrading part's error code within minutes (a burst)"
    )

    @model_validator(mode="before")
    @classmethod
    def _profile_preset(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("profile") is not None:
            try:
                preset = profile_fields(str(data["profile"]))
            except ValueError as err:
                raise ValueError(str(err)) from None
            return {**preset, **data}
        return data

    @field_validator("start")
    @classmethod
    def _whole_seconds(cls, start: datetime) -> datetime:
        if start.microsecond:
            raise ValueError(f"start={start.isoformat()} must be a whole second")
        return start

    @field_validator("interval")
    @classmethod
    def _interval_whole_seconds(cls, interval: timedelta) -> timedelta:
        seconds = interval.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise ValueError(f"interval={seconds:g}s must be a whole number of seconds, at least 1")
        return interval

    @field_validator("duration", "mtbf", "maintenance_interval")
    @classmethod
    def _positive(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"{info.field_name}={value} must be positive")
        return value

    @field_validator("failure_kinds", mode="before")
    @classmethod
    def _known_kinds(cls, kinds: object) -> tuple[str, ...]:
        if isinstance(kinds, str):
            kinds = [k for k in kinds.split(",") if k.strip()]
        if not isinstance(kinds, list | tuple | set | frozenset):
            raise ValueError(f"failure_kinds={kinds!r} must be a list of kind names")
        names = [str(k).strip() for k in kinds]
        unknown = [k for k in names if k not in FAILURE_KINDS]
        if unknown:
            raise ValueError(f"unknown failure kind {unknown[0]!r}; known: {', '.join(FAILURE_KINDS)}")
        return tuple(k for k in FAILURE_KINDS if k in names)  # catalog order, so order in the config does not matter

    @property
    def interval_s(self) -> int:
        return int(self.interval.total_seconds())

    @property
    def start_s(self) -> int:
        return int(self.start.timestamp())

    @property
    def samples_per_machine(self) -> int | None:
        """Readings per machine if none were lost to downtime; None for an unbounded run."""
        if self.duration is None:
            return None
        return math.ceil(self.duration.total_seconds() / self.interval_s)

    @property
    def machine_ids(self) -> tuple[str, ...]:
        width = max(3, len(str(self.machines)))
        return tuple(f"{self.machine_prefix}-{i + 1:0{width}d}" for i in range(self.machines))
