"""Alerts with hysteresis, per machine and failure kind, in event time, and the same across run boundaries.

The rule (:class:`pipelines.settings.AlertRule`): an alert is raised after ``raise_after`` consecutive windows with
risk at or above the raise threshold, and cleared after ``clear_after`` consecutive windows below the (lower) clear
threshold. In between nothing changes, so a risk that wobbles around one threshold cannot start an alert storm.

Event time, and why results do not depend on how the stream is cut into runs. Each pipeline run reads a bounded
snapshot of Kafka, but alerts must come out the same whether the snapshots are small or large:

- A machine's **watermark** is the newest window end seen for it so far, *in arrival order* (Kafka partition and
  offset), minus the allowed lateness. A prediction whose window ends before the watermark when it arrives is
  **too late**: it is stored (it is a fact), but it cannot change alerts already decided. Because the watermark
  follows arrival order, not run boundaries, the same record is late or not however the runs are cut.
- Predictions at or ahead of the watermark are **pending**; once the watermark has passed them they are **final**
  and go through the hysteresis rule in window-end order. (So a machine's newest window waits for a newer one,
  more than the allowed lateness later, before it can raise an alert.)
- What a run leaves behind (the watermark, the hysteresis state per kind and the pending predictions) is carried in
  the store's ``alert_timelines`` table and fed back into the next run, so one run over records 1..n and two runs over
  1..k and k+1..n produce the same alerts. A crash after the state was saved but before Kafka offsets were committed
  replays records that are then either pending (dropped as duplicates by ``(edge_id, seq)``) or behind the watermark.

In the pipeline this is :class:`TrackAlerts`: a stateful DoFn keyed by machine that buffers the run's predictions in
a bag and, on an event-time timer set at the newest window end it holds, advances the machine's timeline.

>>> from pipelines.settings import AlertRule
>>> rule = AlertRule(raise_at=0.7, clear_below=0.4, raise_after=2, clear_after=1)
>>> state, changes = KindState(), []
>>> for risk in [0.8, 0.5, 0.9, 0.95, 0.6, 0.8, 0.3]:
...     state, change = step(rule, state, risk)
...     changes.append(change)
>>> changes
[None, None, None, 'raised', None, None, 'cleared']
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import FastPrimitivesCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from contracts.messages import Alert, encode
from contracts.settings import KafkaSettings
from pipelines.kafka_io import ProduceToKafka
from pipelines.records import PredictionRecord, from_micros, to_micros
from pipelines.settings import AlertRule
from store import PredictionStore

NAMESPACE = "precursor"
TIMELINES = "timelines"
CARRIED = "carried"
PREDICTIONS = "predictions"

Change = Literal["raised", "cleared"]


@dataclass(frozen=True)
class KindState:
    """One machine's alert state for one failure kind: raised or not, and how many consecutive windows so far
    point towards the opposite state."""

    raised: bool = False
    streak: int = 0


def step(rule: AlertRule, state: KindState, risk: float) -> tuple[KindState, Change | None]:
    """The next state after one window's risk, and the change it causes, if any."""
    if not state.raised:
        if risk < rule.raise_at:
            return KindState(False, 0), None
        if state.streak + 1 >= rule.raise_after:
            return KindState(True, 0), "raised"
        return KindState(False, state.streak + 1), None
    if risk >= rule.clear_below:
        return KindState(True, 0), None
    if state.streak + 1 >= rule.clear_after:
        return KindState(False, 0), "cleared"
    return KindState(True, state.streak + 1), None


@dataclass(frozen=True)
class AlertChange:
    """An alert raised or cleared: ``at`` is the window end of the prediction that decided it."""

    machine_id: str
    kind: str
    state: Change
    risk: float
    at_us: int
    model_version: str


@dataclass
class Timeline:
    """What one machine's alerting carries from run to run."""

    newest_us: int | None = None  # the newest window end seen, in arrival order
    kinds: dict[str, KindState] = field(default_factory=dict)
    pending: list[PredictionRecord] = field(default_factory=list)

    def watermark_us(self, lateness_us: int) -> int | None:
        return None if self.newest_us is None else self.newest_us - lateness_us

    def to_json(self) -> str:
        return json.dumps(
            {
                "newest_us": self.newest_us,
                "kinds": {k: [s.raised, s.streak] for k, s in sorted(self.kinds.items())},
                "pending": [_record_json(r) for r in self.pending],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        data = json.loads(text)
        return cls(
            newest_us=data["newest_us"],
            kinds={k: KindState(bool(v[0]), int(v[1])) for k, v in data["kinds"].items()},
            pending=[_record_from_json(r) for r in data["pending"]],
        )


def _record_json(r: PredictionRecord) -> list[Any]:
    return [*r[:6], [list(pair) for pair in r.risk], *r[7:]]


def _record_from_json(values: list[Any]) -> PredictionRecord:
    risk = tuple((str(k), float(v)) for k, v in values[6])
    return PredictionRecord(*values[:6], risk, *values[7:])


@dataclass
class Advance:
    """What one step of a machine's timeline produced."""

    timeline: Timeline
    changes: list[AlertChange]
    too_late: int = 0
    duplicates: int = 0
    finalized: int = 0


def _decision_order(r: PredictionRecord) -> tuple[int, str, str, int]:
    # Two predictions for the same window (say a canary next to the champion) are taken in a fixed order.
    return (r.window_end_us, r.model_version, r.edge_id, r.seq)


def advance(timeline: Timeline, arrivals: Iterable[PredictionRecord], rule: AlertRule, lateness_us: int) -> Advance:
    """Admit ``arrivals`` in arrival order, then decide every pending prediction the watermark has passed."""
    pending = {(r.edge_id, r.seq): r for r in timeline.pending}
    newest = timeline.newest_us
    too_late = duplicates = 0
    for r in sorted(arrivals, key=lambda r: (r.partition, r.offset)):
        if (r.edge_id, r.seq) in pending:
            duplicates += 1
            continue
        if newest is not None and r.window_end_us < newest - lateness_us:
            too_late += 1
            continue
        pending[(r.edge_id, r.seq)] = r
        newest = r.window_end_us if newest is None else max(newest, r.window_end_us)
    kinds = dict(timeline.kinds)
    changes: list[AlertChange] = []
    watermark = None if newest is None else newest - lateness_us
    ready = sorted(
        (r for r in pending.values() if watermark is not None and r.window_end_us < watermark), key=_decision_order
    )
    for r in ready:
        del pending[(r.edge_id, r.seq)]
        for kind, risk in r.risk:
            kinds[kind], change = step(rule, kinds.get(kind, KindState()), risk)
            if change is not None:
                changes.append(AlertChange(r.machine_id, kind, change, risk, r.window_end_us, r.model_version))
    still = sorted(pending.values(), key=_decision_order)
    return Advance(Timeline(newest, kinds, still), changes, too_late, duplicates, len(ready))


BUFFER = BagStateSpec("buffer", FastPrimitivesCoder())
NEWEST = ReadModifyWriteStateSpec("newest", VarIntCoder())
DECIDE = TimerSpec("decide", TimeDomain.WATERMARK)
_BUFFER_PARAM = beam.DoFn.StateParam(BUFFER)
_NEWEST_PARAM = beam.DoFn.StateParam(NEWEST)
_DECIDE_PARAM = beam.DoFn.TimerParam(DECIDE)


class TrackAlerts(beam.DoFn):
    """``(machine_id, (tag, payload))`` -> alert changes; the machine's new timeline to the ``timelines`` output.

    ``tag`` is ``predictions`` (payload: prediction tuples) or ``carried`` (payload: the timeline JSON the last run
    left). Everything a run brings for a machine is buffered; an event-time timer at the newest window end buffered
    fires once the input watermark has passed it (in a bounded run: when all input is in), and the timeline advances
    over the lot in one deterministic step.
    """

    def __init__(self, rule: AlertRule, lateness_us: int) -> None:
        self._rule = rule
        self._lateness_us = lateness_us
        self._raised = Metrics.counter(NAMESPACE, "alerts.raised")
        self._cleared = Metrics.counter(NAMESPACE, "alerts.cleared")
        self._too_late = Metrics.counter(NAMESPACE, "predictions.too_late")
        self._pending = Metrics.counter(NAMESPACE, "predictions.pending")

    def process(
        self,
        element: tuple[str, tuple[str, Any]],
        timestamp: Timestamp = beam.DoFn.TimestampParam,
        buffer: Any = _BUFFER_PARAM,
        newest: Any = _NEWEST_PARAM,
        decide: Any = _DECIDE_PARAM,
    ) -> None:
        buffer.add(element[1])
        before = newest.read()
        latest = timestamp.micros if before is None else max(before, timestamp.micros)
        newest.write(latest)
        decide.set(Timestamp(micros=latest))

    @on_timer(DECIDE)
    def decide(
        self,
        key: str = beam.DoFn.KeyParam,
        buffer: Any = _BUFFER_PARAM,
        newest: Any = _NEWEST_PARAM,
    ) -> Iterator[Any]:
        carried: list[str] = []
        arrivals: list[PredictionRecord] = []
        for tag, payload in buffer.read():
            if tag == CARRIED:
                carried.append(payload)
            else:
                arrivals.extend(PredictionRecord(*r) for r in payload)
        buffer.clear()
        newest.clear()
        before = Timeline.from_json(carried[0]) if carried else Timeline()
        result = advance(before, arrivals, self._rule, self._lateness_us)
        self._too_late.inc(result.too_late)
        self._pending.inc(len(result.timeline.pending))
        for change in result.changes:
            (self._raised if change.state == "raised" else self._cleared).inc()
            yield change
        after = result.timeline.to_json()
        if not carried or after != carried[0]:
            yield beam.pvalue.TaggedOutput(TIMELINES, (key, after))


def alert_message(change: AlertChange) -> Alert:
    return Alert(
        machine_id=change.machine_id,
        state=change.state,
        kind=change.kind,
        risk=change.risk,
        at=from_micros(change.at_us),
        model_version=change.model_version,
    )


class WriteAlerts(beam.DoFn):
    """Alert changes into the store's ``alerts`` table (a replayed change is not stored twice)."""

    def __init__(self, store_path: str) -> None:
        self._store_path = store_path
        self._changes: list[AlertChange] = []

    def start_bundle(self) -> None:
        self._changes = []

    def process(self, change: AlertChange) -> None:
        self._changes.append(change)

    def finish_bundle(self) -> None:
        if not self._changes:
            return
        now = to_micros(datetime.now(UTC))
        c = self._changes
        batch = pa.table(
            {
                "machine_id": [a.machine_id for a in c],
                "kind": [a.kind for a in c],
                "state": [a.state for a in c],
                "ts": pa.array([a.at_us for a in c], pa.timestamp("us", tz="UTC")),
                "risk": pa.array([a.risk for a in c], pa.float64()),
                "model_version": [a.model_version for a in c],
                "stored_at": pa.array([now] * len(c), pa.timestamp("us", tz="UTC")),
            }
        )
        PredictionStore(self._store_path).insert_table("alerts", batch)
        self._changes = []


class WriteTimelines(beam.DoFn):
    """Each machine's new alert timeline into the store, replacing the one the last run left."""

    def __init__(self, store_path: str) -> None:
        self._store_path = store_path
        self._rows: list[tuple[str, str]] = []

    def start_bundle(self) -> None:
        self._rows = []

    def process(self, row: tuple[str, str]) -> None:
        self._rows.append(row)

    def finish_bundle(self) -> None:
        if not self._rows:
            return
        now = to_micros(datetime.now(UTC))
        batch = pa.table(
            {
                "machine_id": [m for m, _ in self._rows],
                "timeline": [t for _, t in self._rows],
                "updated_at": pa.array([now] * len(self._rows), pa.timestamp("us", tz="UTC")),
            }
        )
        PredictionStore(self._store_path).insert_table("alert_timelines", batch, replace=True)
        self._rows = []


def _carried_element(machine_id: str, timeline: str) -> TimestampedValue:
    newest = Timeline.from_json(timeline).newest_us
    at = MIN_TIMESTAMP if newest is None else Timestamp(micros=newest)
    return TimestampedValue((machine_id, (CARRIED, timeline)), at)


class RaiseAlerts(beam.PTransform):
    """``(machine_id, unique prediction records)`` stamped at the newest window end -> alert changes, to the store and
    the alerts topic.

    ``timelines`` are what the last run left per machine (``PredictionStore.alert_timelines()``); the new ones are
    written back to the store.
    """

    def __init__(
        self,
        rule: AlertRule,
        lateness_us: int,
        timelines: Mapping[str, str],
        kafka: KafkaSettings,
        store_path: str,
    ) -> None:
        super().__init__()
        self._rule = rule
        self._lateness_us = lateness_us
        self._timelines = dict(timelines)
        self._kafka = kafka
        self._store_path = store_path

    def expand(self, predictions: beam.PCollection) -> beam.PCollection:
        keyed = predictions | "TagPredictions" >> beam.MapTuple(lambda machine_id, rs: (machine_id, (PREDICTIONS, rs)))
        carried = (
            predictions.pipeline
            | "CarriedTimelines" >> beam.Create(sorted(self._timelines.items()))
            | "StampCarried" >> beam.MapTuple(_carried_element)
        )
        tracked = (
            (keyed, carried)
            | "MergeTimelines" >> beam.Flatten().with_output_types(tuple[str, Any])
            | "TrackAlerts"
            # Keyed by machine_id (a str): the hint gives Beam a deterministic key coder for the state.
            >> beam.ParDo(TrackAlerts(self._rule, self._lateness_us))
            .with_input_types(tuple[str, Any])
            .with_outputs(TIMELINES, main="changes")
        )
        _ = tracked[TIMELINES] | "WriteTimelines" >> beam.ParDo(WriteTimelines(self._store_path))
        changes = tracked["changes"]
        _ = changes | "WriteAlerts" >> beam.ParDo(WriteAlerts(self._store_path))
        _ = (
            changes
            | "EncodeAlerts" >> beam.Map(lambda c: (c.machine_id.encode(), encode(alert_message(c))))
            | "ProduceAlerts" >> beam.ParDo(ProduceToKafka(self._kafka, self._kafka.topics.alerts))
        )
        return changes
