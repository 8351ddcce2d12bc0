"""A prediction store filled from the fleet simulator, for the query, API and dashboard tests.

The simulator gives telemetry, events and the ground truth of every degradation. Predictions come from a scorer that
reads that ground truth with noise (risk rises as a degradation runs towards its end, false alarms included), so the
store has what a real fleet's has: machines at risk, failures that were foreseen with a lead time and some that were
not, alerts with hysteresis, two edges of which one has rolled out a newer model, heartbeats and sensor summaries.
Everything is derived from the seed; tests compare the API's answers with what these lists say, never with numbers
written down by hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import uvicorn

from edge_agent.config import WindowSpec
from edge_agent.parsing import Reading
from edge_agent.summaries import TelemetrySummarizer, summary_messages
from edge_agent.windows import WindowBuilder
from infra.processes import free_ports
from pipelines.alerts import AlertChange, MachineAlerts, Timeline, WriteAlertState, advance
from pipelines.records import from_micros, prediction_record
from precursor.contracts.alerting import AlertRule
from precursor.contracts.messages import EdgeEvent, Event, Heartbeat, Prediction, Reason, ReasonDetail, TelemetrySummary
from precursor.contracts.settings import KafkaSettings
from precursor.simulator import FleetConfig, simulate_fleet
from precursor.store import connect
from tests.fixtures_store import store_messages

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
"""The headers of a request that carries the test token."""
NO_BROKER = KafkaSettings(bootstrap_servers="127.0.0.1:9")
"""Kafka where none answers: for apps whose test never reaches the live tail."""
EDGES = ("edge-a", "edge-b")
OLD_VERSION, NEW_VERSION = "0.1.0", "0.2.0"
ALERT_RULE = AlertRule()
"""The pipeline's default operating point and hysteresis: predictions here carry no threshold of their own."""


@dataclass(frozen=True)
class SimulatedStore:
    path: Path | str
    machines: list[str]
    predictions: list[Prediction]
    events: list[EdgeEvent]
    alerts: list[dict]
    heartbeats: list[Heartbeat]
    edge_of: dict[str, str]
    rollout_at: datetime
    """When edge-a switched to the new model version (edge-b never does)."""
    summaries: list[TelemetrySummary]

    def latest(self) -> dict[str, Prediction]:
        """Each machine's newest prediction by (window_end, seq)."""
        out: dict[str, Prediction] = {}
        for p in self.predictions:
            best = out.get(p.machine_id)
            if best is None or (p.window_end, p.seq) > (best.window_end, best.seq):
                out[p.machine_id] = p
        return out

    def of(self, machine_id: str) -> list[Prediction]:
        return [p for p in self.predictions if p.machine_id == machine_id]

    def failures(self, machine_id: str | None = None) -> list[EdgeEvent]:
        return [e for e in self.events if e.kind == "failure" and machine_id in (None, e.machine_id)]


def _risks(data, machine_id: str, at: datetime, rng: np.random.Generator, kinds: tuple[str, ...]) -> dict[str, float]:
    risk = {k: float(np.clip(0.03 + rng.normal(0, 0.03), 0.0, 0.25)) for k in kinds}
    for d in data.degradations:
        if d.machine_id != machine_id or d.onset > at or (d.end is not None and d.end <= at):
            continue
        progress = min(1.0, (at - d.onset).total_seconds() / 3600 / max(d.warning_h, 0.5))
        risk[d.kind] = float(np.clip(0.08 + 0.9 * progress**1.2 + rng.normal(0, 0.04), 0.0, 1.0))
    return {k: round(v, 4) for k, v in risk.items()}


SIGNATURE_SENSOR = {
    "bearing": "vibration_rms",
    "overheat": "winding_temp",
    "seal_leak": "pressure",
    "electrical": "motor_current",
    "clog": "flow",
}
"""The sensor each failure kind shows on first (precursor.simulator.physics): what an edge's explanation names."""


def _reasons(risk: dict[str, float]) -> list[Reason] | None:
    """The reasons an explaining edge sends with a prediction at or above the threshold: the riskiest kind's
    sensor, then a generic error code."""
    kind = max(risk, key=lambda k: risk[k])
    if risk[kind] < ALERT_RULE.default_threshold:
        return None
    sensor = SIGNATURE_SENSOR[kind]
    return [
        Reason(
            kind="sensor",
            name=sensor,
            risk_drop=round(risk[kind] / 2, 4),
            detail=ReasonDetail(statistic="mean", block=3, from_h=1.5, to_h=0.0),
            text=f"{sensor} level high in the last 1.5 h",
        ),
        Reason(kind="event", name="error:E001", risk_drop=0.02, detail=ReasonDetail(count=2), text="error E001 twice"),
    ]


def simulated_fleet_messages(
    *, machines: int = 10, days: float = 6.0, seed: int = 11, step: timedelta = timedelta(hours=1)
) -> tuple[object, list[Prediction], list[EdgeEvent], datetime]:
    """The simulator's run, and the predictions and events two edges would have sent about it."""
    config = FleetConfig(machines=machines, duration=f"{days}d", interval="10m", seed=seed, mtbf="4d")
    data = simulate_fleet(config)
    rng = np.random.default_rng(seed)
    kinds = tuple(config.failure_kinds)
    machine_ids = list(config.machine_ids)
    edge_of = {m: EDGES[i % 2] for i, m in enumerate(machine_ids)}
    start = config.start
    end = start + config.duration
    rollout_at = start + (end - start) * 2 / 3
    seq = dict.fromkeys(EDGES, 0)
    # Readings per machine, to predict only where the machine was up (no readings while it is down for repair).
    table = data.telemetry
    stamps = {m: table.timestamps[rows] for m, rows in table.machines()}
    items: list[tuple[datetime, int, object]] = [(e.timestamp, 0, e) for e in data.events]
    t = start + timedelta(hours=6)
    while t <= end:
        items.extend((t, 1, (m, t)) for m in machine_ids)
        t += step
    items.sort(key=lambda item: (item[0], item[1]))
    predictions: list[Prediction] = []
    events: list[EdgeEvent] = []
    for _, rank, item in items:
        if rank == 0:
            event: Event = item  # type: ignore[assignment]
            edge = edge_of[event.machine_id]
            seq[edge] += 1
            events.append(
                EdgeEvent(
                    edge_id=edge,
                    seq=seq[edge],
                    timestamp=event.timestamp,
                    machine_id=event.machine_id,
                    event=event.event,
                )
            )
            continue
        machine_id, window_end = item  # type: ignore[misc]
        ts = stamps[machine_id]
        lo = int((window_end - step).timestamp())
        if not np.any((ts > lo) & (ts <= int(window_end.timestamp()))):
            continue
        edge = edge_of[machine_id]
        seq[edge] += 1
        version = NEW_VERSION if edge == "edge-a" and window_end >= rollout_at else OLD_VERSION
        risk = _risks(data, machine_id, window_end, rng, kinds)
        predictions.append(
            Prediction(
                edge_id=edge,
                seq=seq[edge],
                machine_id=machine_id,
                window_start=window_end - timedelta(hours=6),
                window_end=window_end,
                horizon_h=24,
                risk=risk,
                model_name="precursor-lm",
                model_version=version,
                emitted_at=window_end + timedelta(seconds=5),
                reasons=_reasons(risk),
            )
        )
    return data, predictions, events, rollout_at


def pipeline_alerts(path: Path | str, predictions: list[Prediction]) -> list[dict]:
    """The alerts the pipeline raises and clears for these predictions (:func:`pipelines.alerts.advance` under
    :data:`ALERT_RULE`, each machine's predictions in window order), stored by its own writer."""
    writer = WriteAlertState(str(path))
    writer.start_bundle()
    alerts: list[dict] = []
    ordered = sorted(predictions, key=lambda p: (p.machine_id, p.window_end, p.seq))
    for machine_id in sorted({p.machine_id for p in ordered}):
        records = [
            prediction_record(p, partition=0, offset=i) for i, p in enumerate(ordered) if p.machine_id == machine_id
        ]
        changes = advance(Timeline(), records, ALERT_RULE, lateness_us=0).changes
        writer.process(MachineAlerts(machine_id, tuple(changes), None))
        alerts.extend(_alert(change) for change in changes)
    writer.finish_bundle()
    return alerts


def _alert(change: AlertChange) -> dict:
    return {
        "machine_id": change.machine_id,
        "kind": change.kind,
        "state": change.state,
        "ts": from_micros(change.at_us),
        "risk": change.risk,
        "model_version": change.model_version,
    }


def heartbeats_for(predictions: list[Prediction], rollout_at: datetime) -> list[Heartbeat]:
    """An hourly heartbeat per edge, reporting the version it runs and how many machines it serves."""
    out: list[Heartbeat] = []
    by_edge: dict[str, list[Prediction]] = {}
    for p in predictions:
        by_edge.setdefault(p.edge_id, []).append(p)
    for edge, ps in sorted(by_edge.items()):
        hours = sorted({p.window_end for p in ps})
        machines = len({p.machine_id for p in ps})
        for i, at in enumerate(hours):
            version = NEW_VERSION if edge == "edge-a" and at >= rollout_at else OLD_VERSION
            out.append(
                Heartbeat(
                    edge_id=edge,
                    seq=1_000_000 + i,
                    timestamp=at,
                    model_name="precursor-lm",
                    model_version=version,
                    outbox_depth=i % 3,
                    lag_s=0.5,
                    health="ok" if edge == "edge-a" else "degraded",
                    machines=machines,
                )
            )
    return out


def telemetry_summaries(data, edge_of: dict[str, str]) -> list[TelemetrySummary]:
    """The summaries the edges send of the simulated telemetry with summaries on (an hour a period): its readings
    through the edge's window builder and summarizer."""
    table = data.telemetry
    order = np.argsort(table.sensors)
    sensors = tuple(table.sensors[j] for j in order)  # a Reading's sensors are sorted
    summarizer = TelemetrySummarizer(3600)
    builder = WindowBuilder(WindowSpec(length=timedelta(hours=6), every=timedelta(hours=1)), observer=summarizer)
    for machine_id, rows in table.machines():
        values = table.values[rows][:, order].astype(np.float64).tolist()
        stamps = table.timestamps[rows].tolist()
        readings = [Reading(machine_id, float(t), sensors, tuple(v)) for t, v in zip(stamps, values, strict=True)]
        for _ in builder.add_readings(readings):
            pass  # the windows are not wanted here, only the summaries cut as they pass
    seqs = {edge: iter(range(1_000_000, 2**31)) for edge in EDGES}
    return [
        message
        for summary in summarizer.take()
        for message in summary_messages(
            summary, edge_of[summary.machine_id], seqs[edge_of[summary.machine_id]].__next__
        )
    ]


def fill_store(
    path: Path | str,
    *,
    machines: int = 10,
    days: float = 6.0,
    seed: int = 11,
    with_alerts: bool = True,
    with_latest: bool = True,
) -> SimulatedStore:
    data, predictions, events, rollout_at = simulated_fleet_messages(machines=machines, days=days, seed=seed)
    edge_of = {m: EDGES[i % 2] for i, m in enumerate(data.config.machine_ids)}
    beats = heartbeats_for(predictions, rollout_at)
    summaries = telemetry_summaries(data, edge_of)
    store_messages(path, [*predictions, *events, *beats, *summaries])
    if not with_latest:
        with connect(path) as con:  # a store written before the table was kept
            con.execute("DELETE FROM latest_predictions")
    alerts = pipeline_alerts(path, predictions) if with_alerts else []
    machine_ids = sorted({p.machine_id for p in predictions} | {e.machine_id for e in events})
    return SimulatedStore(
        path=path,
        machines=machine_ids,
        predictions=predictions,
        events=events,
        alerts=alerts,
        heartbeats=beats,
        edge_of=edge_of,
        rollout_at=rollout_at,
        summaries=summaries,
    )


@contextmanager
def serving(app: object, *, port: int | None = None) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread of this process; yields its base URL."""
    port = port or free_ports(1)[0]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
