"""The edge agent: telemetry in, windows scored, predictions and events out.

source -> WindowBuilder -> Scorer -> Prediction ─┐
source -> Event ───────────────────────────────── EdgeEvent ─> Sink (Kafka, acks=all)
source -> RowError -> Quarantine
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from contracts.formats import RowError
from contracts.messages import ContractError, EdgeEvent, Event, Prediction, TelemetryReading, validate
from edge_agent.config import EdgeConfig
from edge_agent.publisher import Sink
from edge_agent.quarantine import Quarantine
from edge_agent.sequence import SequenceCounter
from edge_agent.sources import Item
from edge_agent.windows import WindowBuilder
from models.scoring import Scorer, Window

log = logging.getLogger("precursor.edge")

FUTURE_TOLERANCE = timedelta(days=1)
"""Readings stamped further ahead of the edge's clock than this are quarantined: a broken clock, not data."""


@dataclass
class AgentStats:
    readings: int = 0
    events: int = 0
    windows: int = 0
    predictions: int = 0
    quarantined: int = 0


class EdgeAgent:
    """Runs one scorer over the windows of every machine its sources report."""

    def __init__(
        self,
        config: EdgeConfig,
        scorer: Scorer,
        sink: Sink,
        *,
        attributes: dict[str, dict[str, str]] | None = None,
        batch_size: int = 64,
    ) -> None:
        self.config = config
        self.scorer = scorer
        self.sink = sink
        self.windows = WindowBuilder(config.window, attributes)
        self.seq = SequenceCounter(config.state_dir / f"{config.edge_id}.seq")
        self.quarantine = Quarantine(config.state_dir / "quarantine.jsonl")
        self.stats = AgentStats()
        self._batch: list[Window] = []
        self._batch_size = batch_size

    def run(self, items: Iterable[Item]) -> AgentStats:
        """Consume a source to its end (or until interrupted), then flush everything that is pending."""
        try:
            for item in items:
                self.handle(item)
        finally:
            self.flush()
        return self.stats

    def handle(self, item: Item) -> None:
        if isinstance(item, RowError):
            self._quarantine(f"{item.source}:{item.line}", item.raw, item.reason)
        elif isinstance(item, TelemetryReading):
            self._reading(item)
        elif isinstance(item, Event):
            self._event(item)
        else:
            self._quarantine("unknown", repr(item)[:200], f"unexpected item type {type(item).__name__}")

    def flush(self) -> None:
        self._score_batch()
        self.sink.flush()

    def _quarantine(self, source: str, raw: str, reason: str) -> None:
        self.stats.quarantined += 1
        log.warning("quarantined %s: %s", source, reason)
        self.quarantine.put(source, raw, reason)

    def _too_far_ahead(self, at: datetime) -> bool:
        return at > datetime.now(UTC) + FUTURE_TOLERANCE

    def _reading(self, reading: TelemetryReading) -> None:
        if self._too_far_ahead(reading.timestamp):
            self._quarantine(reading.machine_id, reading.model_dump_json(), "timestamp is in the future")
            return
        self.stats.readings += 1
        window = self.windows.add_reading(reading)
        if window is not None:
            self.stats.windows += 1
            self._batch.append(window)
            if len(self._batch) >= self._batch_size:
                self._score_batch()

    def _event(self, event: Event) -> None:
        if self._too_far_ahead(event.timestamp):
            self._quarantine(event.machine_id, event.model_dump_json(), "timestamp is in the future")
            return
        self.stats.events += 1
        self.windows.add_event(event)
        if self.config.publish_events:
            self.sink.send(
                EdgeEvent(
                    edge_id=self.config.edge_id,
                    seq=self.seq.next(),
                    timestamp=event.timestamp,
                    machine_id=event.machine_id,
                    event=event.event,
                )
            )

    def _score_batch(self) -> None:
        if not self._batch:
            return
        windows, self._batch = self._batch, []
        for window, risk in zip(windows, self.scorer.score_many(windows), strict=True):
            for prediction in self._predictions(window, risk):
                self.sink.send(prediction)
                self.stats.predictions += 1

    def _predictions(self, window: Window, risk: dict[str, float]) -> Iterator[Prediction]:
        bad = {k: v for k, v in risk.items() if not (isinstance(v, float | int) and math.isfinite(v) and 0 <= v <= 1)}
        if bad:
            self._quarantine(window.machine_id, repr(risk), f"scorer {self.scorer.name} returned invalid risk {bad}")
            return
        try:
            yield validate(
                Prediction,
                {
                    "edge_id": self.config.edge_id,
                    "seq": self.seq.next(),
                    "machine_id": window.machine_id,
                    "window_start": window.start,
                    "window_end": window.end,
                    "horizon_h": self.scorer.horizon_h,
                    "risk": {k: float(v) for k, v in risk.items()},
                    "model_name": self.scorer.name,
                    "model_version": self.scorer.version,
                },
            )
        except ContractError as err:
            self._quarantine(window.machine_id, repr(risk), str(err))
