"""The operating point: the one rule by which a prediction alerts, from training to the dashboard.

A model's threshold is chosen on its validation data at training time (``precursor evaluate`` reports precision,
recall and lead time at it), and every prediction the model makes carries it (``Prediction.threshold``). The
pipelines raise alerts at that threshold, and the store, the API and the dashboard call a machine "at risk" at the
same one, so what users get is what the model promised. A fleet may override it per model name or for every model.

Which threshold a prediction is judged at, most specific first: the fleet's override for its model name, the fleet's
override for every model, the model's own threshold, and only when the prediction carries none, the default.

Hysteresis is relative to that threshold: an alert is raised after ``raise_after`` consecutive windows at or above
it, and cleared after ``clear_after`` consecutive windows below ``threshold * clear_factor``.

>>> rule = AlertRule(model_thresholds={"drift-zscore": 0.9})
>>> rule.threshold_for("precursor-lm", 0.269), rule.threshold_for("precursor-lm", None)
(0.269, 0.7)
>>> rule.threshold_for("drift-zscore", 0.5), AlertRule(threshold=0.5).threshold_for("precursor-lm", 0.269)
(0.9, 0.5)
>>> round(rule.clear_below(0.269), 4), rule.band(0.3, 0.269), rule.band(0.2, 0.269), rule.band(0.1, 0.269)
(0.1614, 'high', 'elevated', 'low')
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
"""A risk or a threshold: a finite number from 0 to 1."""

Band = Literal["high", "elevated", "low"]

DEFAULT_THRESHOLD = 0.7
"""Where a prediction that carries no threshold of its own (a baseline's) alerts, unless configured otherwise."""


class AlertRule(BaseModel):
    """The operating point and the hysteresis around it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default_threshold: Probability = Field(
        DEFAULT_THRESHOLD, description="for predictions that carry no threshold of their own"
    )
    threshold: Probability | None = Field(
        None, description="the fleet's override for every model, in place of each model's own threshold"
    )
    model_thresholds: dict[str, Probability] = Field(
        default_factory=dict, description="the fleet's override per model name; wins over every other threshold"
    )
    clear_factor: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.6, description="an alert clears below threshold x clear_factor (the gap stops alert storms)"
    )
    raise_after: Annotated[int, Field(ge=1)] = Field(2, description="consecutive windows at or above the threshold")
    clear_after: Annotated[int, Field(ge=1)] = Field(1, description="consecutive windows below the clear level")

    def threshold_for(self, model_name: str, own: float | None) -> float:
        """The threshold a prediction of ``model_name`` that carries ``own`` is judged at."""
        if model_name in self.model_thresholds:
            return self.model_thresholds[model_name]
        if self.threshold is not None:
            return self.threshold
        return self.default_threshold if own is None else own

    def clear_below(self, threshold: float) -> float:
        return threshold * self.clear_factor

    def band(self, risk: float, threshold: float) -> Band:
        """``high``: at or above the threshold (at risk); ``elevated``: in the hysteresis gap, where an alert already
        raised stays raised; ``low``: below the clear level."""
        if risk >= threshold:
            return "high"
        return "elevated" if risk >= self.clear_below(threshold) else "low"
