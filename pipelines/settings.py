"""What the pipelines decide with: alert thresholds, allowed lateness, monitoring windows and the drift threshold.

One settings object, read from ``PRECURSOR_PIPELINE_*`` variables (or built in code and passed in), so a test or a
flow swaps it without patching anything.

Alerts are raised at each prediction's own threshold (the model's operating point, see
:mod:`precursor.contracts.alerting`);
``alert_model_thresholds`` (per model name, e.g. ``PRECURSOR_PIPELINE_ALERT_MODEL_THRESHOLDS='{"precursor-lm": 0.3}'``)
and ``alert_threshold`` (every model) override it for a fleet.

>>> s = PipelineSettings(alert_model_thresholds={"precursor-lm": 0.3}, allowed_lateness="15m")
>>> s.allowed_lateness_s, s.alert_rule.raise_after, s.alert_rule.threshold_for("precursor-lm", 0.269)
(900, 2, 0.3)
>>> PipelineSettings(alert_clear_factor=1.2)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for PipelineSettings
alert_clear_factor
  Input should be less than 1 ...
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from precursor.contracts.alerting import AlertRule, Probability
from precursor.contracts.durations import Duration
from precursor.contracts.object_store import Location

_RULE = AlertRule.model_fields

RETIRED = {
    "PRECURSOR_PIPELINE_ALERT_RAISE_THRESHOLD": "alerts are raised at each model's own threshold now: set "
    "PRECURSOR_PIPELINE_ALERT_THRESHOLD to override it for every model, or PRECURSOR_PIPELINE_ALERT_DEFAULT_THRESHOLD "
    "for predictions that carry none",
    "PRECURSOR_PIPELINE_ALERT_CLEAR_THRESHOLD": "alerts clear relative to their threshold now: set "
    "PRECURSOR_PIPELINE_ALERT_CLEAR_FACTOR (an alert clears below threshold x factor)",
}
"""Variables that no longer mean anything, and what to set instead: refused rather than silently ignored."""


class PipelineSettings(BaseSettings):
    """Settings of the ingest, labeling and monitoring pipelines."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_PIPELINE_", extra="forbid")

    # AlertRule's own fields (default, bounds, meaning) under an ``alert_`` prefix: the operating point has one home.
    # alert_model_thresholds is a JSON object in its variable.
    alert_default_threshold: Probability = _RULE["default_threshold"]
    alert_threshold: Probability | None = _RULE["threshold"]
    alert_model_thresholds: dict[str, Probability] = _RULE["model_thresholds"]
    alert_clear_factor: float = _RULE["clear_factor"]
    alert_raise_after: int = _RULE["raise_after"]
    alert_clear_after: int = _RULE["clear_after"]
    allowed_lateness: Duration = Field(
        timedelta(minutes=10),
        description="how far behind a source's newest event time a record may arrive and still count",
    )
    monitoring_window: Duration = Field(timedelta(days=7), description="length of a monitoring window")
    monitoring_every: Duration = Field(timedelta(days=1), description="how often a monitoring window starts")
    decision_threshold: Probability | None = Field(
        None,
        description="risk at which a window counts as a predicted failure, for predictions that carry no threshold "
        "of their own (the LM's carry the one chosen at training); default: alert_default_threshold",
    )
    drift_threshold: float = Field(0.25, gt=0, description="PSI at or above which a drift event is written")
    work_dir: Path | None = Field(
        None, description="where store snapshots for labeling and monitoring go; shared with remote workers"
    )
    drift_min_observations: int = Field(
        50, ge=1, description="fewer observations in a window than this decide no drift (too noisy to tell)"
    )
    enrolled_edges: Path | None = Field(
        None,
        description="the enrolled-edges file (lines as `precursor edge enroll` prints them): heartbeats signed by a "
        "key it lists for their edge are verified, other signed ones are flagged forged; re-read every run",
    )
    model_registry: Location | None = Field(
        None,
        description="the model registry root (a folder or an object store URL): heartbeats reporting a model hash "
        "none of its releases has are flagged as running an unknown model",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PipelineSettings:
        retired = [f"{name} is retired: {instead}" for name, instead in RETIRED.items() if name in os.environ]
        if retired:
            raise ValueError("; ".join(retired))
        if self.allowed_lateness < timedelta(0):
            raise ValueError(f"allowed_lateness={self.allowed_lateness} must not be negative")
        for name in ("monitoring_window", "monitoring_every"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.monitoring_every > self.monitoring_window:
            raise ValueError(
                f"monitoring_every={self.monitoring_every} is longer than monitoring_window={self.monitoring_window}: "
                "windows would leave gaps"
            )
        return self

    @property
    def alert_rule(self) -> AlertRule:
        """The operating point alerts, "at risk" and the dashboard's bands all follow."""
        return AlertRule(**{name: getattr(self, f"alert_{name}") for name in _RULE})

    @property
    def allowed_lateness_s(self) -> int:
        return int(self.allowed_lateness.total_seconds())

    @property
    def threshold(self) -> float:
        """The risk at which monitoring counts a window as a predicted failure."""
        return self.alert_default_threshold if self.decision_threshold is None else self.decision_threshold
