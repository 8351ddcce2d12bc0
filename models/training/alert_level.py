"""Alert-level figures: what users of the alert stream get from a model, counted on the evaluator's windows.

Window-level figures (:mod:`models.training.evaluate`) count every window at or above the threshold as an alarm. Users
never see windows: they see alerts, raised and cleared by the pipeline's hysteresis
(:class:`precursor.contracts.alerting.AlertRule`: raised after ``raise_after`` consecutive windows at or above the
threshold, cleared after ``clear_after`` consecutive windows below ``threshold * clear_factor``). Here the same rule is
applied to each machine's test windows in time order, and the alerts it yields are counted the way one counts them in
the store's ``alerts`` table, so the evaluator's promise and the alert stream can be compared figure for figure.

Definitions (``h`` is the horizon, ``f`` a failure's time, an alert is open from its raise until its clear):

- a failure counts when at least one window lies in its warning period (a window ending at ``b`` with
  ``b <= f < b + h``, the window label's rule);
- a failure is **alerted** when an alert of its machine is open within the horizon before it: raised at or before
  ``f`` and not cleared by ``f - h``. Its **lead time** is ``f`` minus the raise of the earliest such alert (it may
  exceed ``h``: an alert raised earlier and still open warned that long before);
- an alert is **true** when a failure of its machine follows within the horizon (``raised <= f < raised + h``),
  else **false**; false alerts per machine-week divide by the machine-weeks observed (windows x step / 168 h, as the
  window-level figure does).

>>> from precursor.contracts.alerting import AlertRule
>>> from models.training.scored_window import ScoredWindow
>>> w = [ScoredWindow("m", h * 3600, h >= 4, 6.0 - h if h >= 4 else None, s)
...      for h, s in enumerate([0.9, 0.9, 0.1, 0.8, 0.9, 0.9, 0.1])]
>>> spans = alert_spans(w, threshold=0.5, rule=AlertRule())
>>> [(s.raised_s // 3600, s.cleared_s // 3600) for s in spans]
[(1, 2), (4, 6)]
>>> m = alert_metrics(w, threshold=0.5, every_h=1.0, horizon_h=3.0, rule=AlertRule())
>>> m.alerts, m.false_alerts, m.failures_alerted, m.median_lead_time_h, round(m.false_alerts_per_machine_week, 1)
(2, 1, 1, 2.0, 24.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

from models.training.scored_window import ScoredWindow
from precursor.contracts.alerting import AlertRule

HOUR_S = 3600.0
HOURS_PER_WEEK = 168.0


@dataclass(frozen=True)
class AlertSpan:
    """One alert: raised at the end of the window that completed its streak, cleared likewise (``None``: still
    open at the end of the windows)."""

    machine_id: str
    raised_s: int
    cleared_s: int | None


@dataclass(frozen=True)
class FailureAt:
    machine_id: str
    time_s: int


class AlertMetrics(BaseModel):
    """One scorer's alert-level figures at one threshold under one hysteresis rule."""

    model_config = ConfigDict(extra="forbid")

    alerts: int
    true_alerts: int
    false_alerts: int
    false_alerts_per_machine_week: float
    failures: int
    failures_alerted: int
    median_lead_time_h: float | None
    machine_weeks: float
    threshold: float


def alert_spans(windows: Sequence[ScoredWindow], threshold: float, rule: AlertRule) -> list[AlertSpan]:
    """The alerts ``rule`` raises over each machine's windows, in time order, at ``threshold``.

    The same state machine as the pipeline's (``pipelines.alerts.step``): a gap between windows resets nothing,
    as a machine that stops reporting keeps its alert in the pipeline too.
    """
    by_machine: dict[str, list[ScoredWindow]] = {}
    for w in windows:
        by_machine.setdefault(w.machine_id, []).append(w)
    spans: list[AlertSpan] = []
    clear_below = rule.clear_below(threshold)
    for machine_id, machine_windows in sorted(by_machine.items()):
        machine_windows.sort(key=lambda w: w.end_s)
        raised_at: int | None = None
        streak = 0
        for w in machine_windows:
            if raised_at is None:
                streak = streak + 1 if w.score >= threshold else 0
                if streak >= rule.raise_after:
                    raised_at, streak = w.end_s, 0
            else:
                streak = streak + 1 if w.score < clear_below else 0
                if streak >= rule.clear_after:
                    spans.append(AlertSpan(machine_id, raised_at, w.end_s))
                    raised_at, streak = None, 0
        if raised_at is not None:
            spans.append(AlertSpan(machine_id, raised_at, None))
    return spans


def failures_with_windows(windows: Sequence[ScoredWindow]) -> list[FailureAt]:
    """Each failure that has at least one window in its warning period, as the window-level lead time counts them."""
    seen = {
        (w.machine_id, round(w.end_s + w.hours_to_failure * HOUR_S))
        for w in windows
        if w.failed and w.hours_to_failure is not None
    }
    return [FailureAt(m, t) for m, t in sorted(seen)]


def alert_outcomes(
    spans: Sequence[AlertSpan],
    failures: Sequence[FailureAt],
    horizon_h: float,
    machine_weeks: float,
    threshold: float,
) -> AlertMetrics:
    """Count ``spans`` against ``failures`` by the module's definitions."""
    horizon_s = horizon_h * HOUR_S
    by_machine: dict[str, list[AlertSpan]] = {}
    for s in spans:
        by_machine.setdefault(s.machine_id, []).append(s)
    failure_times: dict[str, list[int]] = {}
    for f in failures:
        failure_times.setdefault(f.machine_id, []).append(f.time_s)
    leads: list[float] = []
    for f in failures:
        open_raises = [
            s.raised_s
            for s in by_machine.get(f.machine_id, [])
            if s.raised_s <= f.time_s and (s.cleared_s is None or s.cleared_s > f.time_s - horizon_s)
        ]
        if open_raises:
            leads.append((f.time_s - min(open_raises)) / HOUR_S)
    true_alerts = sum(
        any(s.raised_s <= t < s.raised_s + horizon_s for t in failure_times.get(s.machine_id, [])) for s in spans
    )
    false_alerts = len(spans) - true_alerts
    return AlertMetrics(
        alerts=len(spans),
        true_alerts=true_alerts,
        false_alerts=false_alerts,
        false_alerts_per_machine_week=false_alerts / machine_weeks if machine_weeks else 0.0,
        failures=len(failures),
        failures_alerted=len(leads),
        median_lead_time_h=float(np.median(leads)) if leads else None,
        machine_weeks=machine_weeks,
        threshold=threshold,
    )


def alert_metrics(
    windows: Sequence[ScoredWindow], threshold: float, every_h: float, horizon_h: float, rule: AlertRule
) -> AlertMetrics:
    """The alert-level figures of scored test windows: ``rule``'s hysteresis at ``threshold``, then
    :func:`alert_outcomes`."""
    return alert_outcomes(
        alert_spans(windows, threshold, rule),
        failures_with_windows(windows),
        horizon_h,
        len(windows) * every_h / HOURS_PER_WEEK,
        threshold,
    )


def alert_table(alerts: Mapping[str, AlertMetrics], rule: AlertRule) -> str:
    """The alert-level figures as an aligned text table, one row per scorer, under a line naming the rule."""
    rows = [["scorer", "alerts", "false_alerts/mw", "failures_alerted", "lead_h"]]
    for name, m in alerts.items():
        lead = "-" if m.median_lead_time_h is None else f"{m.median_lead_time_h:.1f}"
        rows.append(
            [name, str(m.alerts), f"{m.false_alerts_per_machine_week:.3f}", f"{m.failures_alerted}/{m.failures}", lead]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"alerts as the pipeline raises them (after {rule.raise_after} windows at or above the threshold, cleared "
        f"after {rule.clear_after} below {rule.clear_factor:g} x threshold):"
    ]
    lines += ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)
