"""The ``drift-check`` flow: read what the monitoring pipeline measured, and run ``retrain`` when it crosses a line.

Triggers (each from :class:`~flows.settings.DriftCheckSettings`):

- quality: recall of the running model version over the recent ``lookback_h`` below ``min_recall``, judged only when
  at least ``min_failures`` failures happened (recall over one failure is a coin toss);
- drift: a population stability index the monitoring pipeline measured (the model's outputs, or the fleet's events
  it reads as context) above ``max_drift``.

``retrain`` runs as a subflow of the check, so one run in the Prefect UI shows why a retrain happened.

>>> s = DriftCheckSettings(min_recall=0.5, max_drift=0.25, min_failures=2)
>>> trigger_reason(QualityReading(model_version="1", recall=0.2, failures=4, drift=0.1), s)
'recall 0.200 of model 1 over 4 failures is below min_recall 0.500'
>>> trigger_reason(QualityReading(model_version="1", recall=0.0, failures=1, drift=0.1), s) is None
True
"""

from __future__ import annotations

import logging

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field

from flows.monitoring import QualityReading, read_quality
from flows.retrain import RetrainReport, retrain
from flows.retries import STORE_TROUBLE, retry_on
from flows.settings import DriftCheckSettings

__all__ = ["DriftCheckReport", "QualityReading", "drift_check", "trigger_reason"]


class DriftCheckReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    reading: QualityReading | None
    triggered: bool
    reason: str
    retrain: RetrainReport | None = Field(None, description="the retrain this check started, if any")


def trigger_reason(reading: QualityReading, settings: DriftCheckSettings) -> str | None:
    """Why this reading calls for a retrain, or None when it does not."""
    reasons = []
    if (
        reading.recall is not None
        and reading.failures >= settings.min_failures
        and reading.recall < settings.min_recall
    ):
        reasons.append(
            f"recall {reading.recall:.3f} of model {reading.model_version} over {reading.failures} failures "
            f"is below min_recall {settings.min_recall:.3f}"
        )
    if reading.drift is not None and reading.drift > settings.max_drift:
        reasons.append(
            f"drift of {reading.drift_feature} (PSI {reading.drift:.3f}) is above max_drift {settings.max_drift:.3f}"
        )
    return "; ".join(reasons) or None


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except Exception:  # outside a flow run
        return logging.getLogger("precursor.flows.drift_check")


@task(
    name="read-quality",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_on(*STORE_TROUBLE),
    cache_policy=NO_CACHE,
)
def read_quality_task(settings: DriftCheckSettings) -> QualityReading | None:
    return read_quality(settings.store)


@flow(name="drift-check")
def drift_check(settings: DriftCheckSettings | None = None) -> DriftCheckReport:
    """Run ``retrain`` when recall falls or the inputs drift past the configured thresholds."""
    settings = settings or DriftCheckSettings()
    log = _logger()
    reading = read_quality_task(settings)
    if reading is None:
        log.info("no monitoring figures in %s yet: nothing to judge", settings.store)
        return DriftCheckReport(reading=None, triggered=False, reason="no monitoring figures yet")
    reason = trigger_reason(reading, settings)
    if reason is None:
        why = f"model {reading.model_version}: recall {reading.recall}, drift {reading.drift}: within thresholds"
        log.info(why)
        return DriftCheckReport(reading=reading, triggered=False, reason=why)
    log.info("retraining: %s", reason)
    return DriftCheckReport(reading=reading, triggered=True, reason=reason, retrain=retrain(settings.retrain))
