"""Judging a candidate against the champion on the same recent held-out windows, and the table that shows why.

Each model is scored with its own alert threshold (the one chosen on its own validation data) on exactly the same
windows. The candidate is promoted only if it beats the champion's promotion metric by the configured margin; with no
champion yet, a candidate is promoted on its own. Too few failures in the held-out window give no verdict at all:
a model is never promoted (or kept) on one or two failures' worth of noise.

>>> from models.training.evaluate import Metrics
>>> def m(pr_auc): return Metrics(precision=0.5, recall=0.5, f1=0.5, pr_auc=pr_auc, median_lead_time_h=6.0,
...     false_alarms_per_machine_week=0.1, threshold=0.5, windows=100, failed_windows=10, failures=3,
...     failures_alerted=2)
>>> judge(ModelEvaluation(version="2", metrics=m(0.80)), ModelEvaluation(version="1", metrics=m(0.70)),
...       metric="pr_auc", margin=0.02, min_failures=2).promote
True
>>> judge(ModelEvaluation(version="2", metrics=m(0.71)), ModelEvaluation(version="1", metrics=m(0.70)),
...       metric="pr_auc", margin=0.02, min_failures=2).reason
'candidate pr_auc 0.710 does not beat the champion 0.700 by the margin 0.020'
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from models.edge.scoring import Risk, Scorer
from models.training.dataset import LabeledWindow
from models.training.evaluate import Metrics, ScoredWindow, window_metrics
from precursor.contracts.outcomes import ANY_FAILURE, OK

_TOLERANCE = 1e-12


class ModelEvaluation(BaseModel):
    """One model's quality on the held-out windows, overall and per failure kind.

    ``named_recall`` counts a failed window as caught only when it alerts *and* the kind the model rates highest is
    the kind that failed (for a failure of no named kind, alerting is enough): what a technician sent to the right
    part needs. A model that has never heard of a kind cannot name it, so a new kind shows here first.
    """

    model_config = ConfigDict(frozen=True)

    version: str
    metrics: Metrics
    recall_by_kind: dict[str, float] = Field(default_factory=dict, description="failed windows of a kind that alert")
    named_recall: float | None = Field(None, description="failed windows that alert and name their kind")
    named_recall_by_kind: dict[str, float] = Field(default_factory=dict)


class HeldOut(BaseModel):
    """The held-out windows both models are judged on."""

    model_config = ConfigDict(frozen=True)

    from_s: int
    until_s: int
    windows: int
    failed_windows: int
    failures_by_kind: dict[str, int] = Field(description="distinct failures per kind with warning windows held out")

    @property
    def failures(self) -> int:
        return sum(self.failures_by_kind.values())


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    promote: bool
    reason: str


class Comparison(BaseModel):
    """The candidate, the champion (if any), the held-out windows and the verdict: what the Prefect artifact shows."""

    model_config = ConfigDict(frozen=True)

    metric: str
    margin: float
    held_out: HeldOut
    candidate: ModelEvaluation
    champion: ModelEvaluation | None
    verdict: Verdict


def failures_by_kind(windows: Sequence[LabeledWindow]) -> dict[str, int]:
    """Distinct failures (machine, time) per kind among the windows' labels."""
    seen: dict[str, set[tuple[str, int]]] = {}
    for w in windows:
        if w.failed and w.hours_to_failure is not None:
            failure_s = round(w.end_s + w.hours_to_failure * 3600)
            seen.setdefault(w.outcome, set()).add((w.window.machine_id, failure_s))
    return {kind: len(failures) for kind, failures in sorted(seen.items())}


def held_out_summary(windows: Sequence[LabeledWindow], from_s: int, until_s: int) -> HeldOut:
    return HeldOut(
        from_s=from_s,
        until_s=until_s,
        windows=len(windows),
        failed_windows=sum(w.failed for w in windows),
        failures_by_kind=failures_by_kind(windows),
    )


def named_kind(risk: Risk) -> str:
    """The failure kind a risk rates highest; ``failure`` when the model names no kinds.

    >>> named_kind({"failure": 0.6, "bearing": 0.4, "seal_leak": 0.1}), named_kind({"failure": 0.6})
    ('bearing', 'failure')
    """
    named = {k: v for k, v in risk.items() if k != ANY_FAILURE}
    return max(sorted(named), key=lambda k: named[k]) if named else ANY_FAILURE


def evaluate_model(
    scorer: Scorer, version: str, windows: Sequence[LabeledWindow], threshold: float, every_h: float
) -> ModelEvaluation:
    """Score ``windows`` with ``scorer`` and measure it at ``threshold`` (the model's own, from its validation)."""
    risks = scorer.score_many([w.window for w in windows])
    scored = [
        ScoredWindow(w.window.machine_id, w.end_s, w.failed, w.hours_to_failure, float(r[ANY_FAILURE]))
        for w, r in zip(windows, risks, strict=True)
    ]
    alerted: dict[str, list[bool]] = {}
    named: dict[str, list[bool]] = {}
    for w, risk in zip(windows, risks, strict=True):
        if w.outcome == OK:
            continue
        alert = risk[ANY_FAILURE] >= threshold
        alerted.setdefault(w.outcome, []).append(alert)
        named.setdefault(w.outcome, []).append(alert and w.outcome in (ANY_FAILURE, named_kind(risk)))
    all_named = [hit for hits in named.values() for hit in hits]
    return ModelEvaluation(
        version=version,
        metrics=window_metrics(scored, threshold, every_h),
        recall_by_kind={kind: sum(hits) / len(hits) for kind, hits in sorted(alerted.items())},
        named_recall=sum(all_named) / len(all_named) if all_named else None,
        named_recall_by_kind={kind: sum(hits) / len(hits) for kind, hits in sorted(named.items())},
    )


def metric_value(evaluation: ModelEvaluation, metric: str) -> float | None:
    value = evaluation.named_recall if metric == "named_recall" else getattr(evaluation.metrics, metric)
    return None if value is None else float(value)


def judge(
    candidate: ModelEvaluation,
    champion: ModelEvaluation | None,
    *,
    metric: str,
    margin: float,
    min_failures: int,
) -> Verdict:
    """Promote the candidate only if it beats the champion's ``metric`` by ``margin`` on enough failures."""
    failures = candidate.metrics.failures
    if failures < min_failures:
        return Verdict(
            promote=False,
            reason=f"the held-out window holds {failures} failure(s), fewer than min_holdout_failures={min_failures}:"
            " no verdict",
        )
    ours = metric_value(candidate, metric)
    if ours is None:
        return Verdict(promote=False, reason=f"candidate {metric} is undefined on the held-out window")
    if champion is None:
        return Verdict(promote=True, reason=f"no champion yet; candidate {metric} {ours:.3f}")
    theirs = metric_value(champion, metric) or 0.0
    if ours - theirs >= margin - _TOLERANCE:
        return Verdict(
            promote=True,
            reason=f"candidate {metric} {ours:.3f} beats the champion {theirs:.3f} by {ours - theirs:+.3f} "
            f"(margin {margin:.3f})",
        )
    return Verdict(
        promote=False,
        reason=f"candidate {metric} {ours:.3f} does not beat the champion {theirs:.3f} by the margin {margin:.3f}",
    )


def _figure(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def comparison_rows(comparison: Comparison) -> list[dict[str, str]]:
    """One row per figure: its value for the champion and the candidate, and the difference."""
    figures = [
        "pr_auc",
        "recall",
        "named_recall",
        "precision",
        "f1",
        "median_lead_time_h",
        "false_alarms_per_machine_week",
        "threshold",
    ]
    champion, candidate = comparison.champion, comparison.candidate
    rows = []
    for name in figures:
        ours = metric_value(candidate, name)
        theirs = metric_value(champion, name) if champion is not None else None
        delta = None if ours is None or theirs is None else ours - theirs
        rows.append(
            {
                "figure": name + (" (promotion metric)" if name == comparison.metric else ""),
                "champion": _figure(theirs),
                "candidate": _figure(ours),
                "difference": "-" if delta is None else f"{delta:+.3f}",
            }
        )
    kinds = sorted({*candidate.recall_by_kind, *(champion.recall_by_kind if champion else {})})
    for label, field in (("recall", "recall_by_kind"), ("named recall", "named_recall_by_kind")):
        for kind in kinds:
            ours = getattr(candidate, field).get(kind)
            theirs = getattr(champion, field).get(kind) if champion is not None else None
            delta = None if ours is None or theirs is None else ours - theirs
            rows.append(
                {
                    "figure": f"{label} on {kind}",
                    "champion": _figure(theirs),
                    "candidate": _figure(ours),
                    "difference": "-" if delta is None else f"{delta:+.3f}",
                }
            )
    return rows


def comparison_markdown(comparison: Comparison) -> str:
    """The comparison as a Markdown table with the verdict: the Prefect artifact of a ``retrain`` run."""
    champion = comparison.champion.version if comparison.champion else "none"
    h = comparison.held_out
    lines = [
        f"**{'Promoted' if comparison.verdict.promote else 'Not promoted'}**: {comparison.verdict.reason}.",
        "",
        f"Candidate `{comparison.candidate.version}` against champion `{champion}` on {h.windows} held-out windows "
        f"({h.failed_windows} within the horizon of {h.failures} failures: "
        + (", ".join(f"{k} {n}" for k, n in h.failures_by_kind.items()) or "none")
        + ").",
        "",
        "| figure | champion | candidate | difference |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['figure']} | {r['champion']} | {r['candidate']} | {r['difference']} |"
        for r in comparison_rows(comparison)
    ]
    return "\n".join(lines) + "\n"
