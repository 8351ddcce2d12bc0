"""The evaluator's alert-level figures: the pipeline's hysteresis, replayed on test windows, and how alerts count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from models.training.alert_level import AlertSpan, FailureAt, alert_outcomes, alert_spans
from models.training.evaluate import ScoredWindow
from pipelines.alerts import Timeline, advance
from pipelines.records import PredictionRecord
from precursor.contracts.alerting import AlertRule

HOUR = 3600
HOUR_US = HOUR * 10**6


def pipeline_spans(scores: list[float], threshold: float, rule: AlertRule) -> list[tuple[int, int | None]]:
    """What the ingest pipeline's alert tracker raises and clears for one machine's windows, hourly, in order."""
    records = [
        PredictionRecord(
            "e", i, "m", (i - 1) * HOUR_US, i * HOUR_US, 24.0, (("failure", s),), "x", "1", 0, 0, i, threshold
        )
        for i, s in enumerate(scores)
    ]
    changes = advance(Timeline(), records, rule, lateness_us=0).changes
    spans: list[tuple[int, int | None]] = []
    for c in changes:
        if c.state == "raised":
            spans.append((c.at_us // 10**6, None))
        else:
            spans[-1] = (spans[-1][0], c.at_us // 10**6)
    return spans


@settings(max_examples=150, deadline=None)
@given(
    # On and around the threshold (0.5) and each clear level (0.5 x clear_factor), where >= and < matter.
    scores=st.lists(st.sampled_from([0.0, 0.15, 0.2, 0.3, 0.35, 0.45, 0.5, 0.7, 0.95]), max_size=40),
    raise_after=st.integers(1, 3),
    clear_after=st.integers(1, 3),
    clear_factor=st.sampled_from([0.3, 0.6, 0.9]),
)
def test_the_evaluator_raises_and_clears_alerts_exactly_where_the_pipeline_does(
    scores: list[float], raise_after: int, clear_after: int, clear_factor: float
) -> None:
    rule = AlertRule(raise_after=raise_after, clear_after=clear_after, clear_factor=clear_factor)
    windows = [ScoredWindow("m", i * HOUR, False, None, s) for i, s in enumerate(scores)]
    evaluator = [(s.raised_s, s.cleared_s) for s in alert_spans(windows, 0.5, rule)]
    assert evaluator == pipeline_spans(scores, 0.5, rule)


def test_a_failure_is_alerted_by_an_alert_open_within_the_horizon_before_it() -> None:
    h = 10
    spans = [
        AlertSpan("a", 0 * HOUR, 2 * HOUR),  # cleared before the warning period of the failure at 20 h: false
        AlertSpan("a", 5 * HOUR, 11 * HOUR),  # still open at 20 - 10 h? no: cleared at 11 h, after 10 h: alerts it
        AlertSpan("b", 30 * HOUR, None),  # open, no failure follows: false
        AlertSpan("c", 8 * HOUR, 9 * HOUR),  # raised after c's failure: false, and no lead for it
    ]
    failures = [FailureAt("a", 20 * HOUR), FailureAt("c", 7 * HOUR), FailureAt("d", 3 * HOUR)]
    m = alert_outcomes(spans, failures, horizon_h=h, machine_weeks=2.0, threshold=0.5)
    assert (m.alerts, m.true_alerts, m.false_alerts) == (4, 0, 4)  # a's second alert: 5 h + 10 h < 20 h
    assert (m.failures, m.failures_alerted, m.median_lead_time_h) == (3, 1, 15.0)
    assert m.false_alerts_per_machine_week == 2.0

    raised_in_time = alert_outcomes([AlertSpan("a", 12 * HOUR, None)], failures, h, 1.0, 0.5)
    assert (raised_in_time.true_alerts, raised_in_time.failures_alerted, raised_in_time.median_lead_time_h) == (1, 1, 8)
