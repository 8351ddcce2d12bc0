"""Judging a candidate against the champion: the verdict, the per-kind figures and the table the artifact shows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import pytest

from flows.promotion import (
    Comparison,
    ModelEvaluation,
    comparison_markdown,
    comparison_rows,
    evaluate_model,
    held_out_summary,
    judge,
)
from models.edge.scoring import Risk, Window
from models.training.dataset import LabeledWindow
from models.training.evaluate import Metrics


def metrics(*, pr_auc: float | None = 0.5, recall: float = 0.5, failures: int = 4) -> Metrics:
    return Metrics(
        precision=0.5,
        recall=recall,
        f1=0.5,
        pr_auc=pr_auc,
        median_lead_time_h=5.0,
        false_alarms_per_machine_week=0.2,
        threshold=0.4,
        windows=200,
        failed_windows=20,
        failures=failures,
        failures_alerted=2,
    )


def evaluation(version: str, **kw: float | int | None) -> ModelEvaluation:
    return ModelEvaluation(version=version, metrics=metrics(**kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ours", "theirs", "margin", "promote"),
    [(0.80, 0.70, 0.02, True), (0.72, 0.70, 0.02, True), (0.715, 0.70, 0.02, False), (0.60, 0.70, 0.0, False)],
)
def test_the_candidate_must_beat_the_champion_by_the_margin(
    ours: float, theirs: float, margin: float, promote: bool
) -> None:
    verdict = judge(
        evaluation("2", pr_auc=ours), evaluation("1", pr_auc=theirs), metric="pr_auc", margin=margin, min_failures=2
    )
    assert verdict.promote is promote
    assert f"{ours:.3f}" in verdict.reason and f"{theirs:.3f}" in verdict.reason


def test_without_a_champion_the_candidate_is_promoted_on_its_own() -> None:
    verdict = judge(evaluation("1", recall=0.3), None, metric="recall", margin=0.5, min_failures=2)
    assert verdict.promote and verdict.reason == "no champion yet; candidate recall 0.300"


def test_too_few_held_out_failures_give_no_verdict_even_to_a_clear_winner() -> None:
    verdict = judge(
        evaluation("2", pr_auc=0.99, failures=1),
        evaluation("1", pr_auc=0.1),
        metric="pr_auc",
        margin=0.0,
        min_failures=2,
    )
    assert not verdict.promote
    assert "holds 1 failure(s), fewer than min_holdout_failures=2" in verdict.reason


def test_an_undefined_candidate_metric_is_never_promoted() -> None:
    assert not judge(evaluation("2", pr_auc=None), None, metric="pr_auc", margin=0.0, min_failures=1).promote


START = datetime(2026, 3, 1, tzinfo=UTC)


def labeled(
    machine: str, hour: int, outcome: str, level: float, hours_to_failure: float | None = None
) -> LabeledWindow:
    t = np.arange(3, dtype=np.int64) + int(START.timestamp()) + hour * 3600
    window = Window(
        machine,
        START,
        datetime.fromtimestamp(int(t[-1]) + 1, UTC),
        t,
        ("level",),
        np.full((3, 1), level, dtype=np.float32),
    )
    return LabeledWindow(window, outcome, hours_to_failure)


class LevelScorer:
    """Risk is the window's level; the kind it names is given per level band. Our own fake, for a unit test."""

    name, version, horizon_h = "level", "1", 24.0

    def score(self, window: Window) -> Risk:
        return self.score_many([window])[0]

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        out = []
        for w in windows:
            level = float(w.values[-1, 0])
            out.append({"failure": level, "bearing": level * 0.6, "seal_leak": level * 0.3})
        return out


def test_evaluation_counts_recall_per_kind_and_whether_the_alert_names_the_kind() -> None:
    windows = [
        labeled("m1", 0, "ok", 0.1),
        labeled("m1", 1, "ok", 0.7),
        labeled("m1", 2, "bearing", 0.9, 2.0),
        labeled("m2", 0, "seal_leak", 0.8, 3.0),
        labeled("m2", 1, "seal_leak", 0.2, 2.0),
        labeled("m3", 0, "failure", 0.9, 1.0),
    ]
    result = evaluate_model(LevelScorer(), "1", windows, threshold=0.5, every_h=1.0)
    assert result.recall_by_kind == {"bearing": 1.0, "failure": 1.0, "seal_leak": 0.5}
    # It always names bearing: right for bearing, wrong for seal_leak; an unnamed failure needs only the alert.
    assert result.named_recall_by_kind == {"bearing": 1.0, "failure": 1.0, "seal_leak": 0.0}
    assert result.named_recall == pytest.approx(2 / 4)
    assert result.metrics.failed_windows == 4 and result.metrics.recall == pytest.approx(3 / 4)


def test_the_table_shows_each_figure_for_both_models_and_the_verdict() -> None:
    windows = [labeled("m1", 2, "bearing", 0.9, 2.0), labeled("m2", 0, "seal_leak", 0.8, 3.0)]
    candidate = evaluate_model(LevelScorer(), "2", windows, threshold=0.5, every_h=1.0)
    champion = candidate.model_copy(update={"version": "1", "recall_by_kind": {"bearing": 1.0}})
    comparison = Comparison(
        metric="recall",
        margin=0.02,
        held_out=held_out_summary(windows, 0, 10),
        candidate=candidate,
        champion=champion,
        verdict=judge(candidate, champion, metric="recall", margin=0.02, min_failures=1),
    )
    rows = {r["figure"]: r for r in comparison_rows(comparison)}
    assert rows["recall (promotion metric)"] == {
        "figure": "recall (promotion metric)",
        "champion": "1.000",
        "candidate": "1.000",
        "difference": "+0.000",
    }
    assert rows["recall on seal_leak"]["champion"] == "-"
    markdown = comparison_markdown(comparison)
    assert markdown.startswith("**Not promoted**: candidate recall 1.000 does not beat the champion 1.000")
    assert (
        "against champion `1` on 2 held-out windows (2 within the horizon of 2 failures: bearing 1, seal_leak 1)"
        in (markdown)
    )
