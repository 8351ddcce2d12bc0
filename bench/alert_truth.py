"""Alert-level truth: what users get from the alert stream against what the evaluator promised for the same model.

One simulated fleet (``precursor simulate``) is scored twice with the same model at the same threshold:

- **alert stream**: the edge agent daemon replays the fleet's telemetry and events, scores every window and publishes
  to Kafka; the ingest pipeline (``precursor pipeline run --follow``, in a thread while the edge sends) stores
  predictions and events and raises alerts; the figures come from the store's ``alerts`` table joined with its
  failure events, in SQL;
- **evaluator**: the same files cut into windows as training and ``precursor evaluate`` cut them, scored, and counted
  window by window (:func:`models.training.evaluate.window_metrics`) and alert by alert under the pipeline's
  hysteresis rule (:func:`models.training.alert_level.alert_metrics`).

Both sides count alerts by the definitions in :mod:`models.training.alert_level`. Also printed: the alert delay, from
the deciding prediction's arrival in Kafka (its record timestamp) to the alert's ``stored_at``.

The model is the drift-zscore baseline at the fleet's threshold for it (0.9, ``alert_model_thresholds``): no training,
so the figures are the pipeline's and not a training run's. Uses the broker ``PRECURSOR_KAFKA_*`` points at when one
answers, otherwise starts a local one.

    .venv/bin/python bench/alert_truth.py --machines 40 --days 21
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from edge_agent.agent import AgentStats
from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon
from models.edge.baselines import DriftZScore
from models.training.alert_level import AlertMetrics, alert_metrics
from models.training.dataset import Fleet, WindowSpec, build_windows
from models.training.evaluate import Metrics, score_windows, window_metrics
from pipelines.run import RunReport, run_once
from pipelines.settings import PipelineSettings
from precursor.contracts.alerting import AlertRule
from precursor.contracts.messages import Prediction, decode
from precursor.contracts.settings import KafkaSettings
from precursor.simulator import FleetConfig
from precursor.simulator.files import FleetFiles, write_fleet
from precursor.store import connect

MODEL = "drift-zscore"
PIPELINE = PipelineSettings(alert_model_thresholds={MODEL: 0.9})
"""The fleet's operating point for the baseline (its predictions carry none of their own): at the default 0.7 it
alerts on nearly every failure of these fleets, which would make the comparison easy."""
WINDOW = WindowSpec(window_h=12.0, horizon_h=24.0, every_h=3.0, min_points=3, event_lookback_h=24.0)


def fleet_config(machines: int, days: int, seed: int) -> FleetConfig:
    """A fleet where the baseline catches most failures, misses the sudden ones and false-alarms on degradations
    that never fail."""
    return FleetConfig(
        machines=machines,
        start="2026-03-01T00:00:00Z",
        duration=f"{days}d",
        interval="30m",
        seed=seed,
        mtbf="6d",
        sudden_fraction=0.5,
        false_alarm_ratio=1.0,
        upsets_per_day=0.0,
    )


def score_at_edge(files: FleetFiles, kafka: KafkaSettings, state_dir: Path, speedup: float = 0.0) -> AgentStats:
    """The edge agent daemon over the fleet's files, until they end and Kafka has everything it sent."""
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-truth",
            "kafka": kafka,
            "sources": [
                {"type": "replay", "telemetry": str(files.telemetry), "events": str(files.events), "speedup": speedup}
            ],
            "window": {
                "length": f"{WINDOW.window_h:g}h",
                "every": f"{WINDOW.every_h:g}h",
                "min_points": WINDOW.min_points,
                "event_lookback": f"{WINDOW.event_lookback_h:g}h",
            },
            "model": {"type": MODEL, "horizon": f"{WINDOW.horizon_h:g}h"},
            "updates": {"enabled": False},
            "health": {"enabled": False},
            "log": {"format": "text", "level": "WARNING"},
            "state_dir": str(state_dir),
            "drain_timeout": "120s",
        }
    )
    daemon = AgentDaemon(config)
    stats = daemon.run()
    if daemon.outbox.depth:
        raise RuntimeError(f"the edge left {daemon.outbox.depth} message(s) in its outbox")
    return stats


def ingest_while(edge: threading.Thread, kafka: KafkaSettings, store: Path, poll_s: float) -> list[RunReport]:
    """The pipeline as ``precursor pipeline run --follow`` runs it, while ``edge`` sends, then one last run for what
    came after the follower's last look: every prediction is decided in the run that reads it."""
    reports: list[RunReport] = []
    failed: list[BaseException] = []
    stop_following = threading.Event()

    def keep_following() -> None:
        try:
            while not stop_following.is_set():
                report = run_once(kafka, store, pipeline_settings=PIPELINE)
                if report.read:
                    reports.append(report)
                else:
                    stop_following.wait(poll_s)
        except BaseException as err:  # surfaced below: a pipeline failure must fail the run, not vanish
            failed.append(err)

    follower = threading.Thread(target=keep_following, name="pipeline", daemon=True)
    follower.start()
    edge.join()
    stop_following.set()
    follower.join()
    if failed:
        raise RuntimeError(f"the pipeline failed while the edge was sending: {failed[0]!r}") from failed[0]
    last = run_once(kafka, store, pipeline_settings=PIPELINE)
    if last.read:
        reports.append(last)
    return reports


def evaluator_figures(files: FleetFiles, rule: AlertRule) -> tuple[Metrics, AlertMetrics, int]:
    """The evaluator's window-level and alert-level figures for the model, at the threshold the pipeline judges its
    predictions at; and the end of the labels (the first instant the data no longer speaks of)."""
    fleet = Fleet.load(files.telemetry, files.events, files.machines)
    scored = score_windows(DriftZScore(horizon_h=WINDOW.horizon_h), build_windows(fleet, WINDOW))
    threshold = rule.threshold_for(MODEL, None)
    return (
        window_metrics(scored, threshold, WINDOW.every_h),
        alert_metrics(scored, threshold, WINDOW.every_h, WINDOW.horizon_h, rule),
        fleet.last_time_s + 1,
    )


STREAM_FIGURES = """
WITH raised AS (
    SELECT a.machine_id, epoch(a.ts) AS r,
           (SELECT min(epoch(c.ts)) FROM alerts c
             WHERE c.machine_id = a.machine_id AND c.kind = a.kind AND c.state = 'cleared' AND c.ts > a.ts) AS c
    FROM alerts a WHERE a.kind = 'failure' AND a.state = 'raised'
),
failures AS (  -- failures with a prediction in their warning period
    SELECT DISTINCT e.machine_id, epoch(e.ts) AS f FROM events e
    WHERE e.kind = 'failure' AND EXISTS (
        SELECT 1 FROM predictions p
        WHERE p.machine_id = e.machine_id AND epoch(p.window_end) <= epoch(e.ts)
          AND epoch(e.ts) < epoch(p.window_end) + $h)
),
known AS (  -- alerts whose outcome the data tells: a failure followed within the horizon, or the horizon passed
    SELECT r.*, EXISTS (SELECT 1 FROM failures f WHERE f.machine_id = r.machine_id AND r.r <= f.f AND f.f < r.r + $h)
             AS true_alert
    FROM raised r
),
judged AS (SELECT * FROM known WHERE true_alert OR r + $h <= $until),
observed AS (  -- predictions whose label the data tells, as the evaluator keeps windows
    SELECT count(*) AS windows FROM predictions p
    WHERE epoch(p.window_end) + $h <= $until OR EXISTS (
        SELECT 1 FROM failures f
        WHERE f.machine_id = p.machine_id AND epoch(p.window_end) <= f.f AND f.f < epoch(p.window_end) + $h)
),
leads AS (
    SELECT f.machine_id, f.f, (f.f - min(r.r)) / 3600.0 AS lead_h
    FROM failures f JOIN raised r
      ON r.machine_id = f.machine_id AND r.r <= f.f AND (r.c IS NULL OR r.c > f.f - $h)
    GROUP BY f.machine_id, f.f
)
SELECT (SELECT count(*) FROM judged),
       (SELECT count(*) FROM judged WHERE true_alert),
       (SELECT count(*) FROM failures),
       (SELECT count(*) FROM leads),
       (SELECT median(lead_h) FROM leads),
       (SELECT windows FROM observed)
"""


def stream_figures(store: Path, threshold: float, labels_until_s: int) -> AlertMetrics:
    """What users got: the store's alerts, counted against the failures the edge reported."""
    horizon_s = WINDOW.horizon_h * 3600
    with connect(store, read_only=True) as con:
        row = con.execute(STREAM_FIGURES, {"h": horizon_s, "until": labels_until_s}).fetchone()
    assert row is not None
    alerts, true_alerts, failures, alerted, median_lead, windows = row
    machine_weeks = windows * WINDOW.every_h / 168.0
    return AlertMetrics(
        alerts=alerts,
        true_alerts=true_alerts,
        false_alerts=alerts - true_alerts,
        false_alerts_per_machine_week=(alerts - true_alerts) / machine_weeks if machine_weeks else 0.0,
        failures=failures,
        failures_alerted=alerted,
        median_lead_time_h=None if median_lead is None else float(median_lead),
        machine_weeks=machine_weeks,
        threshold=threshold,
    )


def alert_delays_s(kafka: KafkaSettings, store: Path) -> list[float]:
    """Per raised alert: its ``stored_at`` minus the Kafka timestamp of the prediction that raised it."""
    arrived: dict[tuple[str, int], float] = {}
    consumer = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False, consumer_timeout_ms=5_000)
    try:
        partitions = [
            TopicPartition(kafka.topics.predictions, p)
            for p in consumer.partitions_for_topic(kafka.topics.predictions) or []
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        for record in consumer:
            p = decode(Prediction, record.value)
            key = (p.machine_id, int(p.window_end.timestamp() * 1_000_000))
            arrived.setdefault(key, record.timestamp / 1000)
    finally:
        consumer.close()
    with connect(store, read_only=True) as con:
        rows = con.execute(
            "SELECT machine_id, epoch_us(ts), epoch_us(stored_at) / 1e6 FROM alerts "
            "WHERE kind = 'failure' AND state = 'raised'"
        ).fetchall()
    return [stored - arrived[(m, at)] for m, at, stored in rows if (m, at) in arrived]


@dataclass
class Comparison:
    """The evaluator's promise and the alert stream's figures for the same model, fleet and threshold."""

    windows: Metrics
    promised: AlertMetrics
    delivered: AlertMetrics
    edge: AgentStats
    runs: list[RunReport]
    delays_s: list[float]


def run_experiment(
    config: FleetConfig, kafka: KafkaSettings, root: Path, *, speedup: float = 0.0, poll_s: float = 1.0
) -> Comparison:
    files = write_fleet(config, root / "fleet")
    store = root / "store.duckdb"
    stats: list[AgentStats] = []
    edge = threading.Thread(
        target=lambda: stats.append(score_at_edge(files, kafka, root / "edge-state", speedup)), name="edge"
    )
    edge.start()
    runs = ingest_while(edge, kafka, store, poll_s)
    if not stats:
        raise RuntimeError("the edge agent stopped without finishing its replay (see its log above)")
    rule = PIPELINE.alert_rule
    windows, promised, labels_until = evaluator_figures(files, rule)
    delivered = stream_figures(store, promised.threshold, labels_until)
    return Comparison(windows, promised, delivered, stats[0], runs, alert_delays_s(kafka, store))


def table(c: Comparison) -> str:
    def lead(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} h"

    w, p, d = c.windows, c.promised, c.delivered
    rows = [
        ("", "evaluator, windows", "evaluator, alerts", "alert stream"),
        ("failures (with a window before them)", str(w.failures), str(p.failures), str(d.failures)),
        ("failures alerted", str(w.failures_alerted), str(p.failures_alerted), str(d.failures_alerted)),
        ("median lead time", lead(w.median_lead_time_h), lead(p.median_lead_time_h), lead(d.median_lead_time_h)),
        ("alerts raised", "-", str(p.alerts), str(d.alerts)),
        ("false alerts", "-", str(p.false_alerts), str(d.false_alerts)),
        (
            "false alerts per machine-week",
            f"{w.false_alarms_per_machine_week:.2f}",
            f"{p.false_alerts_per_machine_week:.2f}",
            f"{d.false_alerts_per_machine_week:.2f}",
        ),
        (
            "machine-weeks",
            f"{w.windows * WINDOW.every_h / 168:.1f}",
            f"{p.machine_weeks:.1f}",
            f"{d.machine_weeks:.1f}",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows
    )


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kafka_throughput import own_topics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=40)
    parser.add_argument("--days", type=int, default=21)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--speedup", type=float, default=20_000.0, help="replay clock: simulated seconds per second")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between pipeline runs")
    args = parser.parse_args(argv)

    config = fleet_config(args.machines, args.days, args.seed)
    with tempfile.TemporaryDirectory(prefix="precursor-bench-") as scratch, own_topics() as kafka:
        started = time.perf_counter()
        c = run_experiment(config, kafka, Path(scratch), speedup=args.speedup, poll_s=args.poll)
    delays = sorted(c.delays_s)
    p95 = delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))] if delays else float("nan")
    print(
        f"{args.machines} machines x {args.days} d ({MODEL}, threshold {c.promised.threshold:g}, window "
        f"{WINDOW.window_h:g} h every {WINDOW.every_h:g} h, horizon {WINDOW.horizon_h:g} h); edge: "
        f"{c.edge.predictions} predictions, {c.edge.events} events; pipeline: {len(c.runs)} runs that read something; "
        f"{time.perf_counter() - started:.0f} s; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(table(c))
    if delays:
        print(
            f"alert delay, Kafka -> stored alert: n={len(delays)}  p50 {delays[len(delays) // 2]:.1f} s  "
            f"p95 {p95:.1f} s  max {delays[-1]:.1f} s"
        )


if __name__ == "__main__":
    main()
