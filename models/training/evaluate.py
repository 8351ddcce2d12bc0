"""Evaluation: the language model and the baselines, on the same test windows, with thresholds from validation.

Definitions (each window is one prediction; a window "alerts" when ``risk["failure"] >= threshold``):

- precision, recall, F1: over windows, at the threshold chosen on validation (never on test data).
- PR-AUC: average precision over windows, ``sum_k (R_k - R_{k-1}) * P_k`` over distinct score thresholds, highest
  first (ties form one step), the same as scikit-learn's ``average_precision_score``.
- lead time: for each failure with at least one window in its warning period (``[f - horizon, f)``), the hours from
  the end of its earliest alerting warning window to the failure; the median over failures that got an alert.
- Brier score: mean of ``(risk - failed)^2``; ECE: expected calibration error over 10 equal-width bins of risk,
  ``sum_b n_b / N * |mean risk_b - failure rate_b|``. Both read a baseline's score as the probability it claims.
- false alarms per machine-week: alerts *raised* (a window alerts and the machine's previous window, one step
  earlier, did not) on windows whose outcome was ok, divided by machine-weeks observed (windows x step / 168 h).

>>> average_precision([True, False, True, False], [0.9, 0.8, 0.7, 0.1])
0.8333333333333333
>>> w = [ScoredWindow("m", h * 3600, h >= 3, 5.0 - h if h >= 3 else None, s)
...      for h, s in enumerate([0.1, 0.9, 0.2, 0.8, 0.9])]
>>> m = window_metrics(w, threshold=0.5, every_h=1.0)
>>> round(m.precision, 4), m.recall, m.median_lead_time_h, round(m.false_alarms_per_machine_week, 4)
(0.6667, 1.0, 2.0, 33.6)
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from models.edge.calibration import ReliabilityBin, brier_score, expected_calibration_error, reliability_bins
from models.edge.scoring import Scorer
from models.training.alert_level import AlertMetrics, alert_metrics, alert_table
from models.training.dataset import (
    DatasetError,
    Fleet,
    LabeledWindow,
    MachineSplit,
    WindowSpec,
    build_windows,
    parse_time,
    split_from_json,
    split_windows,
)
from models.training.progress import NO_PROGRESS, Progress
from models.training.scored_window import ScoredWindow
from precursor.contracts.alerting import AlertRule
from precursor.contracts.outcomes import ANY_FAILURE

HOURS_PER_WEEK = 168.0
RELIABILITY_BINS = 10
"""Equal-width bins for ECE and the reliability diagram (see :func:`models.edge.calibration.reliability_bins`)."""

log = logging.getLogger(__name__)


# --- metrics ------------------------------------------------------------------------------------------------------


def average_precision(failed: Sequence[bool], scores: Sequence[float]) -> float | None:
    """PR-AUC as average precision; None when there is no failed window (it is undefined then)."""
    y = np.asarray(failed, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    if y.sum() == 0:
        return None
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the last index of each distinct score
    true_pos = np.cumsum(y)[last_of_tie]
    predicted = last_of_tie + 1
    precision = true_pos / predicted
    recall = true_pos / y.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def precision_recall_f1(
    failed: Sequence[bool], scores: Sequence[float], threshold: float
) -> tuple[float, float, float]:
    """At ``score >= threshold``. Precision is 0 when nothing alerts, recall 0 when nothing failed."""
    y = np.asarray(failed, dtype=bool)
    alert = np.asarray(scores, dtype=np.float64) >= threshold
    tp = float(np.sum(alert & y))
    precision = tp / alert.sum() if alert.sum() else 0.0
    recall = tp / y.sum() if y.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def best_f1_threshold(failed: Sequence[bool], scores: Sequence[float]) -> float:
    """The threshold with the highest F1 on these windows (ties: the higher one, fewer alarms). Validation only.

    It lies halfway between the lowest alerting score and the next lower one, not on a score: a model exported to
    int8 moves every risk a little, and a threshold equal to a validation risk would flip that window's decision.

    >>> best_f1_threshold([False, True, True], [0.2, 0.6, 0.9])
    0.4
    """
    return alert_threshold(failed, scores)


def alert_threshold(
    failed: Sequence[bool], scores: Sequence[float], *, beta: float = 1.0, tolerance: float = 0.0
) -> float:
    """The threshold with the highest F-beta on these windows, or with ``tolerance``, the lowest threshold whose
    F-beta is within ``tolerance`` of the highest (the earliest alerts validation cannot tell from the best).
    ``beta`` above 1 weighs recall over precision. Placed as :func:`best_f1_threshold` places it.

    >>> failed, scores = [True, False, False, True, False], [0.9, 0.8, 0.7, 0.4, 0.1]
    >>> [round(alert_threshold(failed, scores, **rule), 3) for rule in ({}, {"beta": 2.0}, {"tolerance": 0.05})]
    [0.85, 0.25, 0.25]
    """
    y = np.asarray(failed, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0:
        raise ValueError("alert_threshold needs at least one scored window")
    if y.sum() == 0:
        return float(np.nextafter(s.max(), np.inf))  # nothing failed: alert on nothing seen
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]
    tp = np.cumsum(y)[last_of_tie]
    precision = tp / (last_of_tie + 1)
    recall = tp / y.sum()
    b2 = beta * beta
    denominator = b2 * precision + recall
    f = np.where(denominator > 0, (1 + b2) * precision * recall / np.maximum(denominator, 1e-300), 0.0)
    # Without tolerance the first maximum (the highest threshold among ties); with it the last within reach.
    best = int(np.flatnonzero(f >= f.max() - tolerance)[-1]) if tolerance > 0 else int(np.argmax(f))
    lowest_alerting = s[last_of_tie[best]]
    if best + 1 < len(last_of_tie):
        return float((lowest_alerting + s[last_of_tie[best + 1]]) / 2)
    return float(np.nextafter(lowest_alerting, -np.inf))  # everything alerts: just below the lowest score


def lead_times_h(windows: Sequence[ScoredWindow], threshold: float) -> tuple[list[float], int]:
    """(lead time per failure that got an alert, number of failures with warning windows)."""
    earliest: dict[tuple[str, int], float | None] = {}
    for w in windows:
        if not w.failed or w.hours_to_failure is None:
            continue
        failure = (w.machine_id, round(w.end_s + w.hours_to_failure * 3600))
        lead = earliest.get(failure)
        if w.score >= threshold and (lead is None or w.hours_to_failure > lead):
            earliest[failure] = w.hours_to_failure
        else:
            earliest.setdefault(failure, None)
    return [v for v in earliest.values() if v is not None], len(earliest)


def false_alarms(windows: Sequence[ScoredWindow], threshold: float, every_h: float) -> tuple[int, float]:
    """(alerts raised on ok windows, machine-weeks observed)."""
    by_machine: dict[str, list[ScoredWindow]] = {}
    for w in windows:
        by_machine.setdefault(w.machine_id, []).append(w)
    raised = 0
    step_s = every_h * 3600
    for machine_windows in by_machine.values():
        machine_windows.sort(key=lambda w: w.end_s)
        previous: ScoredWindow | None = None
        for w in machine_windows:
            alert = w.score >= threshold
            continued = (
                previous is not None and w.end_s - previous.end_s <= step_s * 1.5 and previous.score >= threshold
            )
            if alert and not continued and not w.failed:
                raised += 1
            previous = w
    return raised, len(windows) * every_h / HOURS_PER_WEEK


class Metrics(BaseModel):
    """One scorer's quality on one test set. ``None`` where a figure is undefined (no failures, no alerts)."""

    model_config = ConfigDict(extra="forbid")

    precision: float
    recall: float
    f1: float
    pr_auc: float | None
    median_lead_time_h: float | None
    false_alarms_per_machine_week: float
    threshold: float
    windows: int
    failed_windows: int
    failures: int
    failures_alerted: int
    brier: float | None = None
    """Mean squared error of ``risk["failure"]`` against the outcome (:func:`models.edge.calibration.brier_score`)."""
    ece: float | None = None
    """Expected calibration error over :data:`RELIABILITY_BINS` equal-width bins."""
    reliability: list[ReliabilityBin] = []
    """The reliability diagram's bins: per bin of risk, how many windows, their mean risk, how often they failed."""


def window_metrics(windows: Sequence[ScoredWindow], threshold: float, every_h: float) -> Metrics:
    failed = [w.failed for w in windows]
    scores = [w.score for w in windows]
    precision, recall, f1 = precision_recall_f1(failed, scores, threshold)
    leads, failures = lead_times_h(windows, threshold)
    raised, machine_weeks = false_alarms(windows, threshold, every_h)
    return Metrics(
        precision=precision,
        recall=recall,
        f1=f1,
        pr_auc=average_precision(failed, scores),
        median_lead_time_h=float(np.median(leads)) if leads else None,
        false_alarms_per_machine_week=raised / machine_weeks if machine_weeks else 0.0,
        threshold=threshold,
        windows=len(windows),
        failed_windows=int(sum(failed)),
        failures=failures,
        failures_alerted=len(leads),
        brier=brier_score(failed, scores) if windows else None,
        ece=expected_calibration_error(failed, scores, RELIABILITY_BINS) if windows else None,
        reliability=reliability_bins(failed, scores, RELIABILITY_BINS),
    )


def score_windows(scorer: Scorer, windows: Sequence[LabeledWindow]) -> list[ScoredWindow]:
    risks = scorer.score_many([w.window for w in windows])
    return [
        ScoredWindow(w.window.machine_id, w.end_s, w.failed, w.hours_to_failure, float(r[ANY_FAILURE]))
        for w, r in zip(windows, risks, strict=True)
    ]


# --- the evaluation run -------------------------------------------------------------------------------------------


class EvaluationReport(BaseModel):
    """``{"model": {...}, "baselines": {"NAME": {...}}}``: what ``precursor evaluate --json`` prints."""

    model: Metrics
    baselines: dict[str, Metrics]
    alerts: dict[str, AlertMetrics] = {}
    """Alert-level figures per scorer (``model`` and each baseline), see :mod:`models.training.alert_level`."""
    alert_rule: AlertRule = AlertRule()

    def table(self) -> str:
        """The report as an aligned text table, one row per scorer."""
        rows = [("model", self.model), *self.baselines.items()]
        header = [
            "scorer",
            "precision",
            "recall",
            "f1",
            "pr_auc",
            "lead_h",
            "false_alarms/mw",
            "threshold",
            "brier",
            "ece",
        ]
        lines = [header]
        for name, m in rows:
            lines.append(
                [
                    name,
                    f"{m.precision:.3f}",
                    f"{m.recall:.3f}",
                    f"{m.f1:.3f}",
                    "-" if m.pr_auc is None else f"{m.pr_auc:.3f}",
                    "-" if m.median_lead_time_h is None else f"{m.median_lead_time_h:.1f}",
                    f"{m.false_alarms_per_machine_week:.3f}",
                    f"{m.threshold:.4g}",
                    "-" if m.brier is None else f"{m.brier:.4f}",
                    "-" if m.ece is None else f"{m.ece:.4f}",
                ]
            )
        widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
        text = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in lines]
        m = self.model
        text.append(f"({m.windows} test windows, {m.failed_windows} within the horizon of {m.failures} failures)")
        if self.alerts:
            text.append(alert_table(self.alerts, self.alert_rule))
        return "\n".join(text)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1)

    def write_reliability_diagram(self, path: str | Path) -> Path:
        """The reliability diagram of every scorer, as an SVG file (no plotting library: the install has none)."""
        path = Path(path)
        curves = {"model": self.model.reliability, **{k: m.reliability for k, m in self.baselines.items()}}
        path.write_text(reliability_svg(curves))
        return path


DIAGRAM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def reliability_svg(curves: dict[str, list[ReliabilityBin]], size: int = 420) -> str:
    """One chart: mean risk (x) against observed failure rate (y) per non-empty bin, one line per scorer, the
    diagonal for perfect calibration; each point's area grows with its bin's share of windows."""
    margin, plot = 50, size - 70
    left, top = margin, 20

    def x(v: float) -> float:
        return left + v * plot

    def y(v: float) -> float:
        return top + (1 - v) * plot

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 150}" height="{size}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect x="{left}" y="{top}" width="{plot}" height="{plot}" fill="none" stroke="#999"/>',
        f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" stroke="#bbb" stroke-dasharray="4 3"/>',
    ]
    for tick in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        parts.append(f'<text x="{x(tick):.1f}" y="{y(0) + 14:.1f}" text-anchor="middle">{tick:.1f}</text>')
        parts.append(f'<text x="{x(0) - 6:.1f}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.1f}</text>')
    parts.append(f'<text x="{x(0.5):.1f}" y="{size - 8}" text-anchor="middle">mean predicted risk</text>')
    parts.append(
        f'<text x="12" y="{y(0.5):.1f}" text-anchor="middle" transform="rotate(-90 12 {y(0.5):.1f})">'
        "observed failure rate</text>"
    )
    for i, (name, bins) in enumerate(curves.items()):
        colour = DIAGRAM_COLOURS[i % len(DIAGRAM_COLOURS)]
        total = sum(b.count for b in bins) or 1
        points = [
            (b.mean_predicted, b.observed_rate, b.count)
            for b in bins
            if b.mean_predicted is not None and b.observed_rate is not None
        ]
        line = " ".join(f"{x(p):.1f},{y(o):.1f}" for p, o, _ in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for p, o, n in points:
            radius = 2 + 6 * math.sqrt(n / total)
            parts.append(
                f'<circle cx="{x(p):.1f}" cy="{y(o):.1f}" r="{radius:.1f}" fill="{colour}" fill-opacity="0.6"/>'
            )
        parts.append(f'<rect x="{size - 10}" y="{top + 16 * i}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{size + 4}" y="{top + 16 * i + 9}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def load_lm_scorer(model_dir: Path, trusted_keys: Path | None) -> Scorer:
    """The signed ONNX artifact (when the folder has a manifest) via the edge runtime, else the torch checkpoint."""
    if (model_dir / "manifest.json").is_file():
        if trusted_keys is None:
            raise DatasetError(
                f"{model_dir} is a signed artifact: pass --trusted-keys (a .pub file or a folder of them)"
            )
        from models.edge.runtime import LMScorer
        from models.edge.signing import load_public_keys

        return LMScorer.load(model_dir, load_public_keys(trusted_keys))
    from models.training.model import TorchScorer

    return TorchScorer.load(model_dir)


def evaluate(
    model_dir: str | Path,
    telemetry: str | Path,
    events: str | Path | None,
    machines: str | Path | None = None,
    *,
    horizon_h: float | None = None,
    since: str | None = None,
    trusted_keys: str | Path | None = None,
    progress: Progress = NO_PROGRESS,
    test_machines: MachineSplit | None = None,
    alert_rule: AlertRule | None = None,
) -> EvaluationReport:
    """Score the test windows with the model and the baselines, each at its own validation-chosen threshold.

    Baselines are fitted on the model's own training data and split (read from its ``precursor.json``), so every
    scorer learned from the same windows and is judged on the same ones.
    """
    from models.edge.baselines import DriftZScore, GradientBoostingBaseline, ZScoreRule, baseline_features
    from models.training.model import read_meta

    model_dir = Path(model_dir)
    meta = read_meta(model_dir)
    if horizon_h is not None and not math.isclose(horizon_h, meta.horizon_h):
        raise DatasetError(f"--horizon {horizon_h:g}h differs from the model's horizon ({meta.horizon_h:g}h)")
    window = meta.window
    spec = WindowSpec(
        window_h=float(window["window_h"]),
        horizon_h=meta.horizon_h,
        every_h=float(window["every_h"]),
        min_points=int(window["min_points"]),
        event_lookback_h=float(window["event_lookback_h"]),
    )

    progress.stage("reading the training and test fleets")
    train_fleet = Fleet.load(meta.data["telemetry"], meta.data.get("events"), meta.data.get("machines"))
    split = split_from_json(meta.data["split"])
    test_fleet = Fleet.load(telemetry, events, machines)
    if test_machines is None and "test_machines" in meta.data:  # a model trained with a machine split
        test_machines = MachineSplit.from_json(meta.data["test_machines"])
    if test_machines is not None:  # the baselines learn without the test machines, and only those are tested
        train_fleet, test_fleet = test_machines.apply(train_fleet, test_fleet)
    shared = set(train_fleet.machine_ids) & set(test_fleet.machine_ids)
    since_s = parse_time(since) if since is not None else None
    if shared:
        if since_s is None:
            since_s = split.until_s
        elif since_s < split.until_s:
            raise DatasetError(
                f"--since {since} is before the end of the model's training data ({meta.data['split']['until']}) "
                f"and {len(shared)} machine(s) are in both: test windows would overlap training labels"
            )
    progress.stage("cutting windows")
    test = build_windows(test_fleet, spec, ends_from_s=since_s)
    if not test:
        raise DatasetError(f"no test windows in {telemetry} (since={since}): nothing to evaluate")

    train, validation = split_windows(train_fleet, spec, split)
    tokenizer_settings = {**meta.training.get("tokenizer", {}), "window_h": spec.window_h}
    per_machine = tokenizer_settings.get("scaling", "machine") == "machine"
    unseen = set(test_fleet.machine_ids) - set(train_fleet.machine_ids)
    if per_machine and len(unseen) > len(test_fleet.machine_ids) / 2:
        log.warning(
            "%d of %d test machines were not in the training data, and the model scales values per machine: it "
            "falls back to fleet scaling for them, which it never trained on. Train with --scaling fleet to predict "
            "for new machines.",
            len(unseen),
            len(test_fleet.machine_ids),
        )
    features = baseline_features([w.window for w in train], tokenizer_settings)
    seed = int(meta.training.get("seed", 0))
    baselines: list[Any] = [
        ZScoreRule(features, horizon_h=spec.horizon_h),
        GradientBoostingBaseline(features, horizon_h=spec.horizon_h, seed=seed),
        DriftZScore(horizon_h=spec.horizon_h),
    ]
    failed = [w.failed for w in train]
    results: dict[str, Metrics] = {}
    rule = alert_rule or AlertRule()  # the pipeline's default hysteresis, judged at each scorer's own threshold
    alerts: dict[str, AlertMetrics] = {}
    for baseline in baselines:
        progress.stage(f"baseline {baseline.name}: fitting and scoring")
        if hasattr(baseline, "fit"):
            baseline.fit([w.window for w in train], failed)
        on_validation = score_windows(baseline, validation)
        threshold = best_f1_threshold([w.failed for w in on_validation], [w.score for w in on_validation])
        scored = score_windows(baseline, test)
        results[baseline.name] = window_metrics(scored, threshold, spec.every_h)
        alerts[baseline.name] = alert_metrics(scored, threshold, spec.every_h, spec.horizon_h, rule)

    progress.stage(f"scoring {len(test):,} test windows with the model")
    lm = load_lm_scorer(model_dir, Path(trusted_keys) if trusted_keys is not None else None)
    scored = score_windows(lm, test)
    model_metrics = window_metrics(scored, meta.threshold, spec.every_h)
    alerts = {"model": alert_metrics(scored, meta.threshold, spec.every_h, spec.horizon_h, rule), **alerts}
    return EvaluationReport(model=model_metrics, baselines=results, alerts=alerts, alert_rule=rule)
