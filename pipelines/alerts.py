"""Alerts with hysteresis, per machine and failure kind, at each model's operating point, decided as each
prediction arrives, and the same however the stream is cut into runs.

The rule (:class:`precursor.contracts.alerting.AlertRule`): each prediction is judged at its own threshold (the one
its model
chose on validation, unless the fleet overrides it). An alert is raised after ``raise_after`` consecutive windows at
or above it, and cleared after ``clear_after`` consecutive windows below ``threshold * clear_factor``. In between
nothing changes, so a risk that wobbles around the threshold cannot start an alert storm.

Decided on arrival. A prediction goes through the rule in the run that reads it, in arrival order (Kafka partition
and offset; predictions are keyed by machine, so a machine's are in one partition): the window that completes a
streak raises its alert at once, without waiting for a newer window. Arrival order is fixed on the log, so however
the stream is cut into runs, every prediction is decided once, in the same order, with the same outcome:

- A machine's **watermark** is the newest window end seen for it so far, in arrival order, minus the allowed
  lateness. A prediction whose window ends before the watermark when it arrives is **too late**: it is stored (it is
  a fact), but it changes no alert. A prediction late but within the allowed lateness is decided when it arrives.
- What a run leaves behind (the watermark, the hysteresis state per kind, and the identities of the decided
  predictions not yet behind the watermark) is carried in the store's ``alert_timelines`` table and fed to the next
  run. A replayed record (a crash after the state was saved but before the Kafka offsets were committed) or an
  edge's retried send is then either one of those identities (a duplicate) or behind the watermark (too late), so it
  never counts twice.

In the pipeline this is :class:`TrackAlerts`: a DoFn over each machine's unique records of the run (one element per
machine, in arrival order, from ``DropDuplicates``), with the timelines the last run left as a side input.

>>> from precursor.contracts.alerting import AlertRule
>>> rule = AlertRule(clear_factor=0.6, raise_after=2, clear_after=1)
>>> state, changes = KindState(), []
>>> for risk in [0.3, 0.2, 0.35, 0.4, 0.2, 0.3, 0.1]:  # the model's threshold 0.269: clears below 0.1614
...     state, change = step(rule, state, risk, 0.269)
...     changes.append(change)
>>> changes
[None, None, None, 'raised', None, None, 'cleared']
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Literal

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from pydantic_core import to_json

from pipelines.kafka_io import ProduceToKafka
from pipelines.records import PredictionRecord, from_micros, iso, to_micros
from pipelines.run_log import ledger_stages
from precursor.contracts.alerting import AlertRule
from precursor.contracts.messages import SCHEMA_VERSION, Alert
from precursor.contracts.settings import KafkaSettings
from precursor.store.db import StoreWriter
from precursor.store.ledger import Coverage

NAMESPACE = "precursor"
TIMELINES = "timelines"

Change = Literal["raised", "cleared"]


@dataclass(frozen=True)
class KindState:
    """One machine's alert state for one failure kind: raised or not, and how many consecutive windows so far
    point towards the opposite state."""

    raised: bool = False
    streak: int = 0


_QUIET = KindState(False, 0)
_RAISED = KindState(True, 0)


def step(rule: AlertRule, state: KindState, risk: float, threshold: float) -> tuple[KindState, Change | None]:
    """The next state after one window's risk, judged at ``threshold``, and the change it causes, if any."""
    # The two settled states are shared instances: most windows end in one, and a frozen dataclass is slow to build.
    if not state.raised:
        if risk < threshold:
            return _QUIET, None
        if state.streak + 1 >= rule.raise_after:
            return _RAISED, "raised"
        return KindState(False, state.streak + 1), None
    if risk >= rule.clear_below(threshold):
        return _RAISED, None
    if state.streak + 1 >= rule.clear_after:
        return _QUIET, "cleared"
    return KindState(True, state.streak + 1), None


@dataclass(frozen=True)
class AlertChange:
    """An alert raised or cleared: ``at`` is the window end of the prediction that decided it, ``threshold`` the
    operating point it was judged at."""

    machine_id: str
    kind: str
    state: Change
    risk: float
    at_us: int
    model_version: str
    threshold: float


Identity = tuple[str, int, int]
"""``(edge_id, seq, window_end_us)`` of a decided prediction."""


@dataclass
class Timeline:
    """What one machine's alerting carries from run to run."""

    newest_us: int | None = None  # the newest window end seen, in arrival order
    kinds: dict[str, KindState] = field(default_factory=dict)
    recent: list[Identity] = field(default_factory=list)  # decided, not yet behind the watermark
    # Admitted but undecided: only in timelines saved before alerts were decided on arrival; the next run decides them.
    pending: list[PredictionRecord] = field(default_factory=list)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "newest_us": self.newest_us,
            "kinds": {k: [s.raised, s.streak] for k, s in sorted(self.kinds.items())},
            "recent": [list(i) for i in self.recent],
        }
        if self.pending:
            data["pending"] = [_record_json(r) for r in self.pending]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        data = json.loads(text)
        return cls(
            newest_us=data["newest_us"],
            kinds={k: KindState(bool(v[0]), int(v[1])) for k, v in data["kinds"].items()},
            recent=[(str(e), int(s), int(t)) for e, s, t in data.get("recent", [])],
            pending=[_record_from_json(r) for r in data.get("pending", [])],
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
    decided: int = 0


_ARRIVAL = attrgetter("partition", "offset")
_FIELDS = len(PredictionRecord._fields)
_new = tuple.__new__


def _decision_order(r: PredictionRecord) -> tuple[int, str, str, int]:
    return (r.window_end_us, r.model_version, r.edge_id, r.seq)


def advance(timeline: Timeline, arrivals: Iterable[PredictionRecord], rule: AlertRule, lateness_us: int) -> Advance:
    """Decide each of ``arrivals`` in arrival order, at its own operating point; duplicates of predictions already
    decided and predictions behind the watermark change nothing."""
    newest = timeline.newest_us
    kinds = dict(timeline.kinds)
    decided_ids = {(e, s): end for e, s, end in timeline.recent}
    changes: list[AlertChange] = []
    too_late = duplicates = decided = 0

    def decide(r: PredictionRecord) -> None:
        threshold = rule.threshold_for(r.model_name, r.threshold)
        for kind, risk in r.risk:
            state = kinds.get(kind, _QUIET)
            if not state.raised and risk < threshold:  # what step() says here, without the call: most windows
                kinds[kind] = _QUIET
                continue
            kinds[kind], change = step(rule, state, risk, threshold)
            if change is not None:
                changes.append(
                    AlertChange(r.machine_id, kind, change, risk, r.window_end_us, r.model_version, threshold)
                )
        decided_ids[(r.edge_id, r.seq)] = r.window_end_us

    for r in sorted(timeline.pending, key=_decision_order):
        decide(r)
        decided += 1
    for r in sorted(arrivals, key=_ARRIVAL):
        if (r.edge_id, r.seq) in decided_ids:
            duplicates += 1
            continue
        if newest is not None and r.window_end_us < newest - lateness_us:
            too_late += 1
            continue
        newest = r.window_end_us if newest is None else max(newest, r.window_end_us)
        decide(r)
        decided += 1
    # Only identities a replay could still be admitted with are kept: anything older is too late anyway.
    watermark = None if newest is None else newest - lateness_us
    recent = sorted((e, s, end) for (e, s), end in decided_ids.items() if watermark is None or end >= watermark)
    return Advance(Timeline(newest, kinds, recent), changes, too_late, duplicates, decided)


@dataclass(frozen=True)
class MachineAlerts:
    """What one run decided for one machine: its alert changes and, when it changed, its new timeline."""

    machine_id: str
    changes: tuple[AlertChange, ...]
    timeline: str | None
    arrivals: tuple[tuple[int, int], ...] = ()  # (partition, offset) of every prediction decided on (or skipped)


_PARTITION = PredictionRecord._fields.index("partition")  # the offset follows it


class TrackAlerts(beam.DoFn):
    """``(machine_id, the run's unique prediction tuples in arrival order)`` -> :class:`MachineAlerts`.
    ``timelines`` (a side input) are what the last run left per machine."""

    def __init__(self, rule: AlertRule, lateness_us: int) -> None:
        self._rule = rule
        self._lateness_us = lateness_us
        self._raised = Metrics.counter(NAMESPACE, "alerts.raised")
        self._cleared = Metrics.counter(NAMESPACE, "alerts.cleared")
        self._too_late = Metrics.counter(NAMESPACE, "predictions.too_late")

    def process(
        self, element: tuple[str, tuple[tuple[Any, ...], ...]], timelines: Mapping[str, str]
    ) -> Iterator[MachineAlerts]:
        machine_id, rows = element
        carried = timelines.get(machine_id)
        before = Timeline.from_json(carried) if carried else Timeline()
        # tuple.__new__ names a full row's fields without the NamedTuple constructor's Python call (most of this
        # stage's time per prediction); a row from before threshold and reasons were added takes their defaults.
        records = [_new(PredictionRecord, r) if len(r) == _FIELDS else PredictionRecord(*r) for r in rows]
        result = advance(before, records, self._rule, self._lateness_us)
        self._too_late.inc(result.too_late)
        for change in result.changes:
            (self._raised if change.state == "raised" else self._cleared).inc()
        after = result.timeline.to_json()
        arrivals = tuple((r[_PARTITION], r[_PARTITION + 1]) for r in rows)
        yield MachineAlerts(machine_id, tuple(result.changes), None if after == carried else after, arrivals)


def alert_message(change: AlertChange) -> Alert:
    return Alert(
        machine_id=change.machine_id,
        state=change.state,
        kind=change.kind,
        risk=change.risk,
        at=from_micros(change.at_us),
        model_version=change.model_version,
    )


def alert_json(change: AlertChange) -> bytes:
    """``encode(alert_message(change))``, the same bytes, without building and validating an :class:`Alert` for each
    change: every field of a change comes from a prediction its contract has validated already, and building the
    model cost more than sending the message (6.5 µs against 1 µs). pydantic's own serializer writes the dict, so
    numbers are spelled as the model would spell them; tests/test_pipeline_alerts.py holds the two to the same bytes.
    """
    return to_json(
        {
            "schema_version": SCHEMA_VERSION,
            "machine_id": change.machine_id,
            "state": change.state,
            "kind": change.kind,
            "risk": float(change.risk),
            "at": iso(change.at_us),
            "model_version": change.model_version,
        }
    )


class ProduceAlerts(ProduceToKafka):
    """A machine's alert changes, each as an :class:`Alert` keyed by the machine, to the alerts topic: one step where
    flattening, encoding and sending were three, each paying the runner's cost per element."""

    def process(self, decided: MachineAlerts) -> None:  # type: ignore[override]
        for change in decided.changes:
            super().process((change.machine_id.encode(), alert_json(change)))


class WriteAlertState(beam.DoFn):
    """Alert changes into the store's ``alerts`` table, then the machines' new timelines into ``alert_timelines``.

    In that order: a crash between the two leaves the old timelines, so the replay decides the same predictions
    again and finds its alerts already stored (the table's key drops them); never a saved timeline whose alerts
    were lost. With a ``ledger`` (consumer stage, predictions topic), the new timelines commit with the positions of
    the predictions they decided (:mod:`precursor.store.ledger`): a run after a kill decides again exactly those
    whose timeline did not commit.
    """

    def __init__(self, store_path: str, ledger: tuple[str, str] | None = None) -> None:
        self._store_path = store_path
        self._writer: StoreWriter | None = None
        self._ledger = ledger
        self._decided: list[MachineAlerts] = []

    def start_bundle(self) -> None:
        self._decided = []

    def process(self, decided: MachineAlerts) -> None:
        self._decided.append(decided)

    def setup(self) -> None:
        self._writer = StoreWriter(self._store_path)  # one PostgreSQL connection for the DoFn's life

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def finish_bundle(self) -> None:
        owned = self._writer is None  # a caller that skipped setup (tests write alert state directly)
        store = self._writer or StoreWriter(self._store_path)
        try:
            self._write(store)
        finally:
            if owned:
                store.close()
        self._decided = []

    def _write(self, store: StoreWriter) -> None:
        now = to_micros(datetime.now(UTC))
        c = [change for d in self._decided for change in d.changes]
        if c:
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
            store.insert_table("alerts", batch)
        rows = [(d.machine_id, d.timeline) for d in self._decided if d.timeline is not None]
        covers = None
        if self._ledger is not None:
            stage, topic = self._ledger
            covers = Coverage.of((stage,), topic, (a for d in self._decided for a in d.arrivals))
        if rows or covers:
            batch = pa.table(
                {
                    "machine_id": pa.array([m for m, _ in rows], pa.string()),
                    "timeline": pa.array([t for _, t in rows], pa.string()),
                    "updated_at": pa.array([now] * len(rows), pa.timestamp("us", tz="UTC")),
                }
            )
            store.insert_table("alert_timelines", batch, replace=True, covers=covers)


class RaiseAlerts(beam.PTransform):
    """``(machine_id, the run's unique prediction records)`` -> each machine's :class:`MachineAlerts`; its alert
    changes go to the store and the alerts topic.

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
        consumer: str | None = None,
    ) -> None:
        """``consumer``: whose ledger of consumed offsets the decisions keep (its alerts stage); None keeps none."""
        super().__init__()
        self._consumer = consumer
        self._rule = rule
        self._lateness_us = lateness_us
        self._timelines = dict(timelines)
        self._kafka = kafka
        self._store_path = store_path

    def expand(self, predictions: beam.PCollection) -> beam.PCollection:
        # A side input, read whole by every worker: spreading it first (Create's default reshuffle) buys nothing.
        carried = predictions.pipeline | "CarriedTimelines" >> beam.Create(
            sorted(self._timelines.items()), reshuffle=False
        )
        decided = predictions | "TrackAlerts" >> beam.ParDo(
            TrackAlerts(self._rule, self._lateness_us), timelines=beam.pvalue.AsDict(carried)
        )
        ledger = None
        if self._consumer is not None:
            ledger = (ledger_stages(self._consumer, alerted=True)[1], self._kafka.topics.predictions)
        _ = decided | "WriteAlertState" >> beam.ParDo(WriteAlertState(self._store_path, ledger))
        _ = decided | "ProduceAlerts" >> beam.ParDo(ProduceAlerts(self._kafka, self._kafka.topics.alerts))
        return decided
