"""What the flows are told: one settings object per flow, read from ``PRECURSOR_RETRAIN_*`` / ``PRECURSOR_DRIFT_*``.

Flows take these objects as their one parameter, so a test (or a deployment) swaps the whole configuration without
patching anything. Paths default to the project's ``.state`` folder. The signing key is a *path*: flows load the
private key inside the export step and never log, print, return or send it; only its public ``key_id`` travels.

Nested fields use ``__`` in variable names, e.g. ``PRECURSOR_RETRAIN_TRAINING__MAX_STEPS=200``.

>>> s = RetrainSettings(horizon_h=12, canary_edges=["edge-1"])
>>> s.training.horizon_h
12.0
>>> s.promotion_metric, s.promotion_margin
('pr_auc', 0.02)
>>> RetrainSettings(promotion_margin=-0.1)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for RetrainSettings
promotion_margin
  Input should be greater than or equal to 0 ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.messages import Identifier
from contracts.settings import KafkaSettings
from models.registry import DEFAULT_MODEL_NAME
from models.train import TrainSettings

PromotionMetric = Literal["pr_auc", "recall", "f1", "precision", "named_recall"]
"""Metrics where higher is better; the candidate must beat the champion on one of them by the margin.
``named_recall`` counts a failure as caught only when the alert names its kind (see :mod:`flows.promotion`)."""

DEFAULT_STATE = Path(".state")


class RetrainSettings(BaseSettings):
    """The ``retrain`` flow: where the evidence and the registry are, how to judge a candidate, how to roll it out."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_RETRAIN_", env_nested_delimiter="__", extra="forbid")

    labeled_dataset: Path = Field(
        DEFAULT_STATE / "labeled", description="the labeling pipeline's examples (Parquet, a folder a day)"
    )
    telemetry: Path = Field(
        DEFAULT_STATE / "telemetry" / "telemetry.csv",
        description="generic-format telemetry the examples' windows are cut from (raw telemetry stays at the edge)",
    )
    events: Path | None = Field(None, description="generic-format events: the windows' context (errors, maintenance)")
    machines: Path | None = Field(None, description="generic-format machine attributes")
    work_dir: Path = Field(DEFAULT_STATE / "flows" / "retrain", description="one folder per run: checkpoint, export")
    registry: Path = Field(DEFAULT_STATE / "registry", description="the registry root of signed artifacts")
    model_name: Identifier = DEFAULT_MODEL_NAME
    signing_key: Path = Field(
        DEFAULT_STATE / "keys" / "precursor.key", description="ed25519 private key file (mode 0600; never logged)"
    )
    trusted_keys: list[Path] = Field(
        default_factory=lambda: [DEFAULT_STATE / "keys"], description="public key files, or folders of *.pub files"
    )

    horizon_h: Annotated[float, Field(gt=0, le=24 * 365)] = 24.0
    training: TrainSettings = Field(
        default_factory=lambda: TrainSettings(horizon_h=24.0), description="the models' training settings and budget"
    )
    holdout_h: Annotated[float, Field(gt=0)] = Field(
        7 * 24.0, description="the recent held-out window where candidate and champion are judged, in hours"
    )
    min_holdout_failures: Annotated[int, Field(ge=1)] = Field(
        2, description="fewer failures in the held-out window than this: no verdict, nothing promoted"
    )
    promotion_metric: PromotionMetric = "pr_auc"
    promotion_margin: Annotated[float, Field(ge=0, le=1)] = Field(
        0.02, description="the candidate must beat the champion's metric by at least this much (absolute)"
    )

    publish: bool = Field(True, description="announce a promoted model on Kafka; off: only the registry changes")
    release_target: Identifier = Field("fleet", description="the ModelRelease key: the whole fleet or one site")
    canary_edges: list[Identifier] = Field(default_factory=list, description="edges that get a new model first")
    canary_deadline_s: Annotated[float, Field(gt=0)] = Field(
        600.0, description="how long the canaries have to report the new version healthy before it is rolled back"
    )
    healthy_heartbeats: Annotated[int, Field(ge=1)] = Field(
        2, description="heartbeats per canary, running the new version with health ok, that count as healthy"
    )
    artifact_base_uri: str | None = Field(
        None, description="where edges fetch artifacts (URI prefix + /<model>/<version>); file:// of the registry"
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)

    @model_validator(mode="after")
    def _one_horizon(self) -> RetrainSettings:
        # One horizon for the question the model answers, the labels and the held-out judging.
        if self.training.horizon_h != self.horizon_h:
            self.training = self.training.model_copy(update={"horizon_h": self.horizon_h})
        return self


class DriftCheckSettings(BaseSettings):
    """The ``drift-check`` flow: where the monitoring figures are, and the thresholds that trigger ``retrain``."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_DRIFT_", env_nested_delimiter="__", extra="forbid")

    store: Path = Field(
        DEFAULT_STATE / "store" / "predictions.duckdb", description="the prediction store the monitoring writes to"
    )
    min_recall: Annotated[float, Field(ge=0, le=1)] = Field(0.5, description="retrain when recall falls below this")
    max_drift: Annotated[float, Field(gt=0)] = Field(
        0.25, description="retrain when a PSI rises above this (0.25: the population has changed)"
    )
    min_failures: Annotated[int, Field(ge=1)] = Field(
        2, description="recall over fewer failures than this is noise: it triggers nothing"
    )
    retrain: RetrainSettings = Field(default_factory=RetrainSettings)
