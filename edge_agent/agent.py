"""The edge agent: telemetry in, windows scored, predictions and events out through the durable outbox.

source batch -> readings -> WindowBuilder -> (at commit) Scorer.score_many -> Prediction ─┐
source batch -> events ──────────────────────────────────────────────────── EdgeEvent ───┼─> Outbox (SQLite) -> Kafka
heartbeat ────────────────────────────────────────────────────────────────── Heartbeat ──┤
WindowBuilder boundaries -> TelemetrySummarizer (opt-in) ────────────── TelemetrySummary ─┘
bad records, future timestamps, unknown machines -> Quarantine (a file and a counter per kind)

A *commit* scores the windows completed since the last one, then writes in one transaction the predictions, events,
heartbeats, the window journal and the sources' positions. Only after it returns are the sources acknowledged
(MQTT PUBACKs): nothing a source was told is safe can be lost by a crash, and nothing before a saved position is
processed twice.

With a plain :class:`~edge_agent.publisher.Sink` instead of an :class:`~edge_agent.outbox.Outbox` (a unit test's
list, or a publisher) the agent sends directly and numbers messages with a :class:`SequenceCounter` file.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Literal, Protocol

import numpy as np

from edge_agent.checkpoint import WindowCheckpoint, position_writer, read_positions
from edge_agent.config import EdgeConfig
from edge_agent.flow_meter import FlowMeter
from edge_agent.identity import EdgeIdentity, agent_build
from edge_agent.outbox import Outbox
from edge_agent.parsing import Reading
from edge_agent.publisher import Sink
from edge_agent.quarantine import Quarantine
from edge_agent.scorers import RunningModel, ScorerSlot
from edge_agent.sequence import SequenceCounter
from edge_agent.summaries import TelemetrySummarizer, summary_messages
from edge_agent.telemetry_source import Item, SourceBatch
from edge_agent.windows import WindowBuilder
from infra.energy import Rapl
from models.edge.scoring import Scorer, Window
from precursor.contracts.formats import RowError, read_machines
from precursor.contracts.messages import (
    ContractError,
    EdgeEvent,
    Event,
    Heartbeat,
    Prediction,
    Reason,
    TelemetryReading,
    TelemetrySummary,
    validate,
)

log = logging.getLogger("precursor.edge")

_machine, _time = itemgetter(0), itemgetter(1)  # of a Reading

Health = Literal["ok", "degraded", "failing"]


@dataclass
class AgentStats:
    readings: int = 0
    events: int = 0
    windows: int = 0
    predictions: int = 0
    quarantined: int = 0
    heartbeats: int = 0
    summaries: int = 0
    commits: int = 0
    scoring_errors: int = 0
    explained: int = 0
    explain_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Explainer(Protocol):
    """What the agent needs of an explainer (:class:`models.edge.explain.OcclusionExplainer`)."""

    def explain_many(self, windows: Sequence[Window], risks: Sequence[dict[str, float]]) -> list[list[Reason]]: ...


class LatencyRecorder:
    """Seconds from a reading's arrival to its prediction being committed to the outbox.

    Keeps the latest ``keep`` values for percentiles, and cumulative counts per bucket for Prometheus.
    """

    BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

    def __init__(self, keep: int = 100_000) -> None:
        self.recent: deque[float] = deque(maxlen=keep)
        self.bucket_counts = [0] * (len(self.BUCKETS) + 1)
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float, n: int = 1) -> None:
        self.recent.extend([seconds] * n)
        self.count += n
        self.total += seconds * n
        i = 0
        while i < len(self.BUCKETS) and seconds > self.BUCKETS[i]:
            i += 1
        self.bucket_counts[i] += n

    def percentile(self, q: float) -> float | None:
        if not self.recent:
            return None
        return float(np.percentile(np.fromiter(self.recent, dtype=np.float64), q))


class EdgeAgent:
    """Runs one scorer (swappable, see :class:`ScorerSlot`) over the windows of every machine its sources report."""

    def __init__(
        self,
        config: EdgeConfig,
        scorer: Scorer | ScorerSlot,
        sink: Sink | Outbox,
        *,
        attributes: dict[str, dict[str, str]] | None = None,
        batch_size: int = 16,
        clock: Callable[[], float] = time.time,
        identity: EdgeIdentity | None = None,
    ) -> None:
        self.config = config
        self.identity = identity  # signs heartbeats once the edge is enrolled; without it they go unsigned
        self.slot = scorer if isinstance(scorer, ScorerSlot) else ScorerSlot(RunningModel(scorer))
        self._clock = clock
        if isinstance(sink, Outbox):
            self.outbox: Outbox | None = sink
            self.sink: Sink | None = None
            self._next_seq: Callable[[], int] = sink.next_seq
            self.checkpoint: WindowCheckpoint | None = WindowCheckpoint(sink.db, config.window)
        else:
            self.outbox, self.sink, self.checkpoint = None, sink, None
            self._next_seq = SequenceCounter(config.state_dir / f"{config.edge_id}.seq").next
        interval = config.summary_interval
        self.summarizer = None if interval is None else TelemetrySummarizer(int(interval.total_seconds()))
        self.windows = WindowBuilder(config.window, attributes, journal=self.checkpoint, observer=self.summarizer)
        self.quarantine = Quarantine(config.state_dir / "quarantine.jsonl", max_bytes=config.quarantine.max_bytes)
        self.allowed_machines = self._allowed_machines()
        self.stats = AgentStats()
        self.latency = LatencyRecorder()
        self.flow = FlowMeter(rapl=Rapl.open())  # what the heartbeats report as flow
        self.batch_size = batch_size
        self._max_future = config.input.max_future.total_seconds()
        self._pending: list[tuple[Window, float]] = []
        self._committing: list[float] = []
        self._positions: dict[str, str] = {}
        self._acks: list[tuple[str, Any]] = []
        self._items_since_commit = 0
        self._oldest_pending: float | None = None
        self._last_snapshot = time.monotonic()
        self._in_batch = False  # quarantined records are held until the batch ends (see handle_batch)
        self._recent: deque[Window] = deque(maxlen=config.updates.self_test.windows)
        self._recent_lock = threading.Lock()
        self.last_scoring_failure: float | None = None
        self._explainer: tuple[Scorer, Explainer | None] | None = None
        self.explain_seconds = 0.0
        """Wall seconds spent explaining alerting windows (see :mod:`models.edge.explain`)."""
        self.on_acks: Callable[[list[tuple[str, Any]]], None] | None = None
        """Called after each commit with the (source, ack) pairs it made safe (the daemon tells the sources)."""

    def _allowed_machines(self) -> set[str] | None:
        policy = self.config.machines
        if not policy.allow and policy.file is None:
            return None
        allowed = set(policy.allow)
        if policy.file is not None:
            allowed |= set(read_machines(policy.file))
        return allowed

    # --- restart ------------------------------------------------------------------------------------------------

    def restore(self) -> dict[str, str]:
        """Rebuild the open windows from the journal; returns each source's saved position."""
        if self.outbox is None or self.checkpoint is None:
            return {}
        self.quarantine.recover(self.outbox.db)
        marks, readings, events = self.checkpoint.load()
        self.windows.restore(marks, readings, events)
        if readings or marks:
            log.info(
                "restored %d open-window readings of %d machines",
                len(readings),
                len(marks),
                extra={"readings": len(readings), "machines": len(marks)},
            )
        return read_positions(self.outbox.db)

    # --- input --------------------------------------------------------------------------------------------------

    def run(self, items: Iterable[Item]) -> AgentStats:
        """Consume items to their end (or until interrupted), committing as it goes and once more at the end."""
        try:
            for item in items:
                self.handle(item)
                if self.commit_due():
                    self.commit()
        finally:
            self.commit()
        return self.stats

    def handle(self, item: Item) -> None:
        self._handle(item, time.monotonic())
        self._items_since_commit += 1

    def handle_batch(self, batch: SourceBatch) -> None:
        """Handle a source's batch; its position and ack are committed with the next commit after it.

        When enough windows complete inside one batch, they are committed before the batch ends (so a burst of
        windows does not wait for the whole batch). Those commits leave the batch's position alone: after a crash the
        batch is read again, and the readings and events already committed are dropped as repeats. The batch's bad
        records are held back from those commits and quarantined with the one that saves its position, so that a
        record read again after a crash is not quarantined twice.
        """
        self._in_batch = True
        try:
            self._handle_batch(batch)
        finally:
            self._in_batch = False
        self.quarantine.release()

    def _handle_batch(self, batch: SourceBatch) -> None:
        arrived = batch.arrived
        limit = self._clock() + self._max_future
        allowed = self.allowed_machines
        tracked = self.windows.states
        max_machines = self.config.machines.max
        pending = self._pending
        items = batch.items
        if self._all_admitted(items, limit):
            # The usual batch: readings only, none the slow path would refuse. The builder takes them in one loop.
            self.stats.readings += len(items)
            for window in self.windows.add_readings(items):  # type: ignore[arg-type]
                pending.append((window, arrived))
                if len(pending) >= self.batch_size:
                    self.commit()
            items = []
        add = self.windows.add_reading
        readings = 0
        for item in items:
            if type(item) is Reading:
                machine_id = item.machine_id
                if (
                    item.t > limit
                    or (allowed is not None and machine_id not in allowed)
                    or (machine_id not in tracked and len(tracked) >= max_machines)
                ):
                    self._reading(item, arrived)  # the slow path says why, and quarantines it
                    continue
                readings += 1
                window = add(item)
                if window is not None:
                    pending.append((window, arrived))
                    if len(pending) >= self.batch_size:
                        self.stats.readings += readings
                        readings = 0
                        self.commit()
            else:
                self._handle(item, arrived)
        self.stats.readings += readings
        self.stats.windows = self.windows.emitted
        self._items_since_commit += len(batch.items)
        if self._oldest_pending is None and batch.items:
            self._oldest_pending = arrived
        if batch.position is not None:
            self._positions[batch.source] = batch.position
        if batch.ack is not None:
            self._acks.append((batch.source, batch.ack))

    def _all_admitted(self, items: list[Item], limit: float) -> bool:
        """Whether every item is a :class:`Reading` that :meth:`_refused` lets through (a machine allowed, its time
        not past ``limit``, room for the new machines), told apart with set and C-level passes."""
        if not items or set(map(type, items)) != {Reading}:
            return False
        if max(map(_time, items)) > limit:  # type: ignore[arg-type]
            return False
        machines = set(map(_machine, items))  # type: ignore[arg-type]
        if self.allowed_machines is not None and not machines <= self.allowed_machines:
            return False
        tracked = self.windows.states
        new = len(machines) if not tracked else len(machines.difference(tracked))
        return not new or len(tracked) + new <= self.config.machines.max

    @property
    def uncommitted(self) -> bool:
        """Whether anything was handled since the last commit."""
        return bool(self._items_since_commit or self._pending or self._positions or self._acks)

    def _handle(self, item: Item, arrived: float) -> None:
        if type(item) is Reading:
            self._reading(item, arrived)
        elif isinstance(item, RowError):
            self._quarantine(f"{item.source}:{item.line}", item.raw, item.reason)
        elif isinstance(item, TelemetryReading):
            self._reading(Reading.from_contract(item), arrived)
        elif isinstance(item, Event):
            self._event(item)
        else:
            self._quarantine("unknown", repr(item)[:200], f"unexpected item type {type(item).__name__}", "invalid")

    def _quarantine(self, source: str, raw: str, reason: str, kind: str | None = None, *, held: bool = True) -> None:
        """``held=False``: not a record of the batch being handled (a window the scorer refused), so not held."""
        self.stats.quarantined += 1
        kind = self.quarantine.put(source, raw, reason, kind, held=held and self._in_batch)
        log.warning("quarantined %s: %s", source, reason, extra={"source": source, "kind": kind})

    def _refused(self, machine_id: str, t: float, raw: Callable[[], str]) -> bool:
        """Quarantines (and returns True for) a record from an unknown machine or stamped too far ahead."""
        if t > self._clock() + self._max_future:
            stamp = datetime.fromtimestamp(t, UTC).isoformat()
            limit = timedelta(seconds=self._max_future)
            self._quarantine(
                machine_id,
                raw(),
                f"timestamp is in the future: {stamp} is more than input.max_future={limit} ahead of this edge's clock",
                "future",
            )
            return True
        if self.allowed_machines is not None and machine_id not in self.allowed_machines:
            self._quarantine(
                machine_id, raw(), f"unknown machine {machine_id!r}: not in machines.allow/file", "unknown_machine"
            )
            return True
        if machine_id not in self.windows and self.windows.machines >= self.config.machines.max:
            self._quarantine(
                machine_id,
                raw(),
                f"machine {machine_id!r} would be machine number {self.windows.machines + 1}, over machines.max",
                "unknown_machine",
            )
            return True
        return False

    def _reading(self, reading: Reading, arrived: float) -> None:
        if self._refused(reading.machine_id, reading.t, lambda: _describe_reading(reading)):
            return
        self.stats.readings += 1
        window = self.windows.add_reading(reading)
        self.stats.windows = self.windows.emitted
        if window is not None:
            self._pending.append((window, arrived))
        if self._oldest_pending is None:
            self._oldest_pending = arrived

    def _event(self, event: Event) -> None:
        if self._refused(event.machine_id, event.timestamp.timestamp(), event.model_dump_json):
            return
        if not self.windows.add_event(event):
            return  # a repeat (a redelivered message): its EdgeEvent was already committed
        self.stats.events += 1
        if self.config.publish_events:
            self._send(
                EdgeEvent(
                    edge_id=self.config.edge_id,
                    seq=self._next_seq(),
                    timestamp=event.timestamp,
                    machine_id=event.machine_id,
                    event=event.event,
                )
            )

    def _send(self, message: Prediction | EdgeEvent | Heartbeat | TelemetrySummary) -> None:
        if self.outbox is not None:
            self.outbox.stage(message)
        else:
            assert self.sink is not None
            self.sink.send(message)

    # --- commit -------------------------------------------------------------------------------------------------

    def commit_due(self, now: float | None = None) -> bool:
        """Whether enough is pending, or what was handled first waited long enough, to commit now."""
        if len(self._pending) >= self.batch_size or self._items_since_commit >= self.config.outbox.max_commit_items:
            return True
        if self._oldest_pending is None:
            return False
        waited = (now if now is not None else time.monotonic()) - self._oldest_pending
        return waited >= self.config.outbox.commit_interval.total_seconds()

    def commit(self) -> list[tuple[str, Any]]:
        """Score what is pending and make it durable; returns the acks the sources may now send (source, ack)."""
        self._score_pending()
        self._send_summaries()
        if self.outbox is not None and self.checkpoint is not None:
            checkpoint = self.checkpoint
            writers: list[Callable[[Any], None]] = [checkpoint.write]
            if time.monotonic() - self._last_snapshot >= checkpoint.snapshot_every_s:
                writers = [lambda db: checkpoint.write_snapshot(db, self.windows.held())]
                self._last_snapshot = time.monotonic()
            if self._positions:
                writers.append(position_writer(self._positions))
            writers.append(self.quarantine.write)
            try:
                self.outbox.commit(writers)
            except BaseException:
                self.checkpoint.rolled_back()
                self.quarantine.rolled_back()
                raise
            self.checkpoint.committed()
            self.quarantine.committed()
        else:
            assert self.sink is not None
            self.sink.flush()
            self.quarantine.flush()
        done = time.monotonic()
        for arrived in self._committing:
            self.latency.add(done - arrived)
        self._committing = []
        self._positions = {}
        self._items_since_commit = 0
        self._oldest_pending = None
        self.stats.commits += 1
        acks, self._acks = self._acks, []
        if acks and self.on_acks is not None:
            self.on_acks(acks)
        return acks

    def _score_pending(self) -> None:
        if not self._pending:
            return
        pending = self._pending[:]
        self._pending.clear()  # in place: handle_batch holds this list while it commits mid-batch
        windows = [w for w, _ in pending]
        while True:
            running = self.slot.running
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                risks = running.scorer.score_many(windows)
                self.flow.scored(
                    windows=len(windows),
                    wall_s=time.perf_counter() - started,
                    cpu_s=time.process_time() - cpu_started,
                )
                break
            except Exception as err:  # a model that fails at run time: roll back rather than stop predicting
                reason = f"{type(err).__name__}: {err}"
                if self.slot.rollback(reason):
                    continue
                self.stats.scoring_errors += len(windows)
                self.last_scoring_failure = time.monotonic()
                for w in windows:
                    self._quarantine(
                        w.machine_id,
                        f"window ending {w.end.isoformat()}",
                        f"scoring failed: {reason}",
                        "scorer",
                        held=False,
                    )
                return
        scorer = running.scorer
        reasons = self._explain(scorer, windows, risks)
        for (window, arrived), risk, why in zip(pending, risks, reasons, strict=True):
            prediction = self._prediction(scorer, window, risk, why)
            if prediction is not None:
                self._send(prediction)
                self.stats.predictions += 1
                self._committing.append(arrived)
        with self._recent_lock:
            self._recent.extend(windows)

    def _explain(
        self, scorer: Scorer, windows: list[Window], risks: list[dict[str, float]]
    ) -> list[list[Reason] | None]:
        """The reasons of the windows at or above the alert threshold (``explain.threshold``, else the model's own),
        in one explanation over all of them; None for the rest, and wherever the model cannot be explained. A failed
        explanation costs the reasons, never the predictions."""
        out: list[list[Reason] | None] = [None] * len(windows)
        explainer = self._explainer_for(scorer)
        threshold = self.config.explain.threshold
        if threshold is None:
            threshold = getattr(scorer, "threshold", None)
        if explainer is None or threshold is None:
            return out
        picked = [i for i, risk in enumerate(risks) if _top_risk(risk) >= threshold]
        if not picked:
            return out
        started = time.perf_counter()
        try:
            found = explainer.explain_many([windows[i] for i in picked], [risks[i] for i in picked])
        except Exception as err:  # the predictions go out without reasons
            self.stats.explain_errors += len(picked)
            log.warning("could not explain %d windows: %s: %s", len(picked), type(err).__name__, err)
            return out
        self.explain_seconds += time.perf_counter() - started
        self.stats.explained += len(picked)
        for i, reasons in zip(picked, found, strict=True):
            out[i] = reasons
        return out

    def _explainer_for(self, scorer: Scorer) -> Explainer | None:
        """The explainer of the running model, made again when the model changes; None where explanations are off
        or the model has none (a baseline scores no token sequences)."""
        if self._explainer is not None and self._explainer[0] is scorer:
            return self._explainer[1]
        explainer = None
        spec = self.config.explain
        if spec.enabled and hasattr(scorer, "score_token_ids"):
            from models.edge.explain import ExplainSettings, explainer_for  # onnxruntime: only where the LM runs

            settings = ExplainSettings(
                max_reasons=spec.max_reasons, min_log_odds_drop=spec.min_log_odds_drop, max_sensors=spec.max_sensors
            )
            try:
                explainer = explainer_for(scorer, settings)
            except Exception as err:  # the model still scores: its predictions go out without reasons
                log.warning("cannot explain model %s %s: %s: %s", scorer.name, scorer.version, type(err).__name__, err)
        self._explainer = (scorer, explainer)
        return explainer

    def _prediction(
        self, scorer: Scorer, window: Window, risk: dict[str, float], reasons: list[Reason] | None = None
    ) -> Prediction | None:
        bad = {k: v for k, v in risk.items() if not (isinstance(v, float | int) and math.isfinite(v) and 0 <= v <= 1)}
        if bad:
            self._quarantine(
                window.machine_id,
                repr(risk),
                f"scorer {scorer.name} returned invalid risk {bad}",
                "scorer",
                held=False,
            )
            return None
        try:
            return validate(
                Prediction,
                {
                    "edge_id": self.config.edge_id,
                    "seq": self._next_seq(),
                    "machine_id": window.machine_id,
                    "window_start": window.start,
                    "window_end": window.end,
                    "horizon_h": scorer.horizon_h,
                    "risk": {k: float(v) for k, v in risk.items()},
                    "model_name": scorer.name,
                    "model_version": scorer.version,
                    # The LM runtime carries the threshold chosen at training; baseline scorers have none.
                    "threshold": getattr(scorer, "threshold", None),
                    "reasons": reasons,
                },
            )
        except ContractError as err:
            self._quarantine(window.machine_id, repr(risk), str(err), "scorer", held=False)
            return None

    def _send_summaries(self) -> None:
        """Stage the telemetry summaries of the periods that ended since the last commit: in this commit, with the
        window journal's boundaries they were cut at, so a restart neither repeats nor skips one."""
        if self.summarizer is None:
            return
        for summary in self.summarizer.take():
            try:
                messages = summary_messages(summary, self.config.edge_id, self._next_seq)
            except ContractError as err:  # not expected of admitted readings; quarantined rather than lost silently
                period = f"summary of {summary.start}..{summary.end}"
                self._quarantine(summary.machine_id, period, str(err), "summary", held=False)
                continue
            for message in messages:
                self._send(message)
                self.stats.summaries += 1

    def recent_windows(self) -> list[Window]:
        """The latest windows scored (for a new model's self-test); safe to call from another thread."""
        with self._recent_lock:
            return list(self._recent)

    # --- heartbeat ----------------------------------------------------------------------------------------------

    def heartbeat(self, *, health: Health, outbox_depth: int, lag_s: float) -> Heartbeat:
        """Stage a heartbeat: the running model, the outbox depth and lag, health, and what flowed through the agent
        since the last one. Sent with the next commit."""
        running = self.slot.running
        message = Heartbeat(
            edge_id=self.config.edge_id,
            seq=self._next_seq(),
            timestamp=datetime.fromtimestamp(self._clock(), UTC),
            model_name=running.scorer.name,
            model_version=running.scorer.version,
            model_sha256=running.sha256,
            outbox_depth=outbox_depth,
            lag_s=max(0.0, lag_s),
            health=health,
            machines=self.windows.machines,
            agent=agent_build(),
            flow=self.flow.report(
                readings=self.stats.readings, windows=self.windows.emitted, predictions=self.stats.predictions
            ),
        )
        if self.identity is not None:
            message = self.identity.sign(message)
        self._send(message)
        self.stats.heartbeats += 1
        return message

    def close(self) -> None:
        self.quarantine.close()


def _top_risk(risk: dict[str, float]) -> float:
    """The highest risk; -1 where none is a number (such a risk is quarantined, not explained)."""
    values = [float(v) for v in risk.values() if isinstance(v, float | int) and math.isfinite(v)]
    return max(values, default=-1.0)


def _describe_reading(reading: Reading) -> str:
    values = {n: (None if v != v else v) for n, v in zip(reading.sensors, reading.values, strict=True)}
    stamp = datetime.fromtimestamp(reading.t, UTC).isoformat()
    return json.dumps({"timestamp": stamp, "machine_id": reading.machine_id, "values": values})
