"""What the flows are told: one settings object per flow, read from ``PRECURSOR_RETRAIN_*`` / ``PRECURSOR_DRIFT_*``.

Flows take these objects as their one parameter, so a test (or a deployment) swaps the whole configuration without
patching anything. Paths default to the project's state folder (``.state``, or wherever ``PRECURSOR_STATE_DIR``
points when the settings are made). The signing key is a *path*: flows load the private key inside the export step
and never log, print, return or send it; only its public ``key_id`` travels.

Nested fields use ``__`` in variable names, e.g. ``PRECURSOR_RETRAIN_TRAINING__MAX_STEPS=200``; the nested fields
not named keep their defaults.

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

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from models.edge.registry import DEFAULT_MODEL_NAME
from models.training.train import TrainSettings
from precursor.contracts.durations import Duration
from precursor.contracts.messages import Identifier
from precursor.contracts.object_store import Location, ObjectStoreSettings
from precursor.contracts.settings import KafkaSettings, PrecursorSettings, StoreLocation

PromotionMetric = Literal["pr_auc", "recall", "f1", "precision", "named_recall"]
"""Metrics where higher is better; the candidate must beat the champion on one of them by the margin.
``named_recall`` counts a failure as caught only when the alert names its kind (see :mod:`flows.promotion`)."""


def _listed(value: Any) -> Any:
    """A list as a variable gives it: JSON (``["a", "b"]``), else items between commas (one path, ``edge-1,edge-2``)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)  # a JSONDecodeError is a ValueError: reported under the field's name
    return [item.strip() for item in text.split(",") if item.strip()]


def in_state(*parts: str) -> Callable[[], Path]:
    """A default under the state folder, read when the settings are made (so ``PRECURSOR_STATE_DIR`` moves it)."""
    return lambda: PrecursorSettings().state_dir.joinpath(*parts)


def _with_defaults(cls: type[BaseModel], data: Any, nested: tuple[str, ...]) -> Any:
    """``data`` with each nested field given as a mapping laid over that field's default, key by key.

    pydantic-settings hands a nested variable (``PRECURSOR_RETRAIN_TRAINING__MAX_MINUTES=2``) over as a mapping of
    only what was named, which would otherwise replace the whole default and lose (or lack) the rest of it.
    """
    if not isinstance(data, dict):
        return data
    merged = dict(data)
    for name in nested:
        given = merged.get(name)
        if isinstance(given, dict):
            default = cls.model_fields[name].get_default(call_default_factory=True)
            merged[name] = _deep_merge(default.model_dump(), given)
    return merged


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        merged[key] = _deep_merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


class RetrainSettings(BaseSettings):
    """The ``retrain`` flow: where the evidence and the registry are, how to judge a candidate, how to roll it out."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_RETRAIN_", env_nested_delimiter="__", extra="forbid")

    labeled_dataset: Location = Field(
        default_factory=in_state("datasets", "labeled"),
        description="the labeling pipeline's examples (Parquet, a folder a day), where `precursor pipeline label` "
        "writes them by default; a folder or an object store URL (s3://bucket/labeled)",
    )
    telemetry: Path = Field(
        default_factory=in_state("telemetry", "telemetry.csv"),
        description="generic-format telemetry the examples' windows are cut from (raw telemetry stays at the edge)",
    )
    events: Path | None = Field(None, description="generic-format events: the windows' context (errors, maintenance)")
    machines: Path | None = Field(None, description="generic-format machine attributes")
    work_dir: Path = Field(
        default_factory=in_state("flows", "retrain"), description="one folder per run: checkpoint, export"
    )
    registry: Location = Field(
        default_factory=in_state("registry"),
        description="the registry root of signed artifacts: a folder or an object store URL (s3://bucket/registry)",
    )
    model_name: Identifier = DEFAULT_MODEL_NAME
    signing_key: Path = Field(
        default_factory=in_state("keys", "precursor.key"),
        description="ed25519 private key file (mode 0600; never logged)",
    )
    trusted_keys: Annotated[list[Path], NoDecode, BeforeValidator(_listed)] = Field(
        default_factory=lambda: [in_state("keys")()], description="public key files, or folders of *.pub files"
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
    canary_edges: Annotated[list[Identifier], NoDecode, BeforeValidator(_listed)] = Field(
        default_factory=list, description="edges that get a new model first"
    )
    canary_deadline_s: Annotated[float, Field(gt=0)] = Field(
        600.0, description="how long the canaries have to report the new version healthy before it is rolled back"
    )
    healthy_heartbeats: Annotated[int, Field(ge=1)] = Field(
        2, description="heartbeats per canary, running the new version with health ok, that count as healthy"
    )
    release_validity: Duration = Field(
        timedelta(days=30), description="how long a release stays valid after it is issued; edges refuse it after that"
    )
    artifact_base_uri: str | None = Field(
        None,
        description="where edges fetch artifacts (URI prefix + /<model>/<version>); default: the registry's URL, or "
        "file:// of a local registry",
    )
    object_store: ObjectStoreSettings = Field(
        default_factory=ObjectStoreSettings,
        description="how to reach an object store location (PRECURSOR_S3_* or the standard AWS_* variables)",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)

    @model_validator(mode="before")
    @classmethod
    def _partial_nested(cls, data: Any) -> Any:
        return _with_defaults(cls, data, ("training",))

    @model_validator(mode="after")
    def _one_horizon(self) -> RetrainSettings:
        # One horizon for the question the model answers, the labels and the held-out judging.
        if self.training.horizon_h != self.horizon_h:
            tokenizer = self.training.tokenizer.model_copy(update={"horizon_h": self.horizon_h})
            self.training = self.training.model_copy(update={"tokenizer": tokenizer})
        return self


class DriftCheckSettings(BaseSettings):
    """The ``drift-check`` flow: where the monitoring figures are, and the thresholds that trigger ``retrain``."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_DRIFT_", env_nested_delimiter="__", extra="forbid")

    store: StoreLocation = Field(
        default_factory=lambda: PrecursorSettings().store_path,
        description="the prediction store the monitoring writes to (a file or postgresql:// URL; PRECURSOR_STORE_URL "
        "or PRECURSOR_STORE, else in the state folder)",
    )
    min_recall: Annotated[float, Field(ge=0, le=1)] = Field(0.5, description="retrain when recall falls below this")
    max_drift: Annotated[float, Field(gt=0)] = Field(
        0.25, description="retrain when a PSI rises above this (0.25: the population has changed)"
    )
    min_failures: Annotated[int, Field(ge=1)] = Field(
        2, description="recall over fewer failures than this is noise: it triggers nothing"
    )
    retrain: RetrainSettings = Field(default_factory=RetrainSettings)

    @model_validator(mode="before")
    @classmethod
    def _partial_nested(cls, data: Any) -> Any:
        return _with_defaults(cls, data, ("retrain",))
