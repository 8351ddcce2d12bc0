"""Per-machine windows in event time.

Each machine's readings are cut on a fixed schedule: boundaries fall on multiples of ``every`` since the epoch, and
the window that ends at boundary ``b`` holds the readings with ``b - length <= t < b``. A window is emitted when the
first reading at or after ``b`` arrives, so it is complete as long as readings arrive in order.

The rule for out-of-order, late and repeated data (documented, and counted):
- a reading older than the newest reading seen but not older than the last emitted boundary is inserted in time
  order: it still counts for the next window;
- a reading older than the last emitted boundary is *late*: that window was already scored and is never re-scored,
  so the reading is dropped and counted in ``late_dropped``;
- a reading for an instant the machine already has a reading for is a *repeat* (a redelivered MQTT message, a line
  replayed after a crash): the first one wins, the repeat is dropped and counted in ``repeats_dropped``;
- when a machine goes quiet for several periods, only the window at the latest boundary is emitted (no empty
  windows for the gap).

A :class:`WindowJournal` hears of every reading the builder keeps and every boundary it passes, so the agent can
persist the open windows with the outbox and :meth:`WindowBuilder.restore` them after a restart.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import numpy as np

from contracts.messages import Event, TelemetryReading
from edge_agent.config import WindowSpec
from edge_agent.records import Reading
from models.scoring import Window


class WindowJournal(Protocol):
    """Told of each change to the builder's state that a restart would need."""

    def accepted(self, reading: Reading) -> None: ...

    def emitted(self, machine_id: str, boundary: int) -> None: ...

    def event(self, event: Event) -> None: ...


@dataclass
class _MachineState:
    times: list[float] = field(default_factory=list)  # epoch seconds, ascending
    rows: list[tuple[float, ...]] = field(default_factory=list)
    layouts: list[tuple[str, ...]] = field(default_factory=list)  # the sensors of each row
    events: list[Event] = field(default_factory=list)  # by time
    last_maintenance: dict[str, Event] = field(default_factory=dict)
    emitted_until: int | None = None  # the last boundary a window was emitted for


class WindowBuilder:
    """Feed readings and events; get back each :class:`Window` as it completes."""

    def __init__(
        self,
        spec: WindowSpec,
        attributes: Mapping[str, Mapping[str, str]] | None = None,
        journal: WindowJournal | None = None,
    ) -> None:
        self.spec = spec
        self.journal = journal
        self._length = int(spec.length.total_seconds())
        self._every = int(spec.every.total_seconds())
        self._lookback = int(spec.event_lookback.total_seconds())
        self._attributes = attributes or {}
        self._machines: dict[str, _MachineState] = {}
        self.late_dropped = 0
        self.repeats_dropped = 0
        self.emitted = 0

    @property
    def machines(self) -> int:
        return len(self._machines)

    @property
    def states(self) -> Mapping[str, object]:
        """The machines the builder holds state for (read-only use: membership and count)."""
        return self._machines

    def __contains__(self, machine_id: object) -> bool:
        return machine_id in self._machines

    def emitted_until(self, machine_id: str) -> int | None:
        state = self._machines.get(machine_id)
        return None if state is None else state.emitted_until

    def keep_from(self, boundary: int) -> int:
        """After emitting the window ending at ``boundary``, readings before this are never needed again."""
        return boundary + self._every - self._length

    def add_event(self, event: Event) -> bool:
        """Adds an event to its machine's context; False (and nothing changes) if the machine already has it."""
        state = self._machines.setdefault(event.machine_id, _MachineState())
        i = bisect.bisect_left(state.events, event.timestamp, key=lambda e: e.timestamp)
        while i < len(state.events) and state.events[i].timestamp == event.timestamp:
            if state.events[i].event == event.event:
                return False
            i += 1
        state.events.insert(i, event)
        if event.kind == "maintenance" and event.detail:
            # Kept beyond the lookback: "time since last maintenance of each part" is context the model reads.
            latest = state.last_maintenance.get(event.detail)
            if latest is None or latest.timestamp <= event.timestamp:
                state.last_maintenance[event.detail] = event
        if self.journal is not None:
            self.journal.event(event)
        return True

    def add_reading(self, reading: Reading | TelemetryReading) -> Window | None:
        """Adds one reading; returns the window that this reading completed, if any."""
        if type(reading) is not Reading:
            reading = Reading.from_contract(reading)  # type: ignore[arg-type]
        machine_id, t = reading.machine_id, reading.t
        state = self._machines.get(machine_id)
        if state is None:
            state = self._machines[machine_id] = _MachineState()
        times = state.times
        window = None
        if not times or t > times[-1]:
            # In order (the usual case): append, after emitting the window this reading completes, if any.
            if state.emitted_until is not None and t < state.emitted_until:
                self.late_dropped += 1
                return None
            if times:
                boundary = int(t // self._every) * self._every
                if boundary > times[-1] and (state.emitted_until is None or boundary > state.emitted_until):
                    window = self._emit(machine_id, state, boundary)
            times.append(t)
            state.rows.append(reading.values)
            state.layouts.append(reading.sensors)
        else:
            if state.emitted_until is not None and t < state.emitted_until:
                self.late_dropped += 1
                return None
            i = bisect.bisect_left(times, t)
            if times[i] == t:
                self.repeats_dropped += 1
                return None
            times.insert(i, t)
            state.rows.insert(i, reading.values)
            state.layouts.insert(i, reading.sensors)
        if self.journal is not None:
            self.journal.accepted(reading)
        return window

    def held(self) -> Iterable[Reading]:
        """Every reading the builder holds: what a restart needs to rebuild the open windows."""
        new = tuple.__new__
        for machine_id, state in self._machines.items():
            for t, values, sensors in zip(state.times, state.rows, state.layouts, strict=True):
                yield new(Reading, (machine_id, t, sensors, values))

    def restore(self, emitted: Mapping[str, int], readings: Iterable[Reading], events: Iterable[Event]) -> None:
        """Rebuild open windows after a restart from what the journal kept; tells the journal nothing."""
        journal, self.journal = self.journal, None
        try:
            for machine_id, boundary in emitted.items():
                self._machines.setdefault(machine_id, _MachineState()).emitted_until = boundary
            for event in events:
                self.add_event(event)
            for r in readings:
                state = self._machines.setdefault(r.machine_id, _MachineState())
                i = bisect.bisect_left(state.times, r.t)
                if i < len(state.times) and state.times[i] == r.t:
                    continue
                state.times.insert(i, r.t)
                state.rows.insert(i, r.values)
                state.layouts.insert(i, r.sensors)
        finally:
            self.journal = journal

    def _emit(self, machine_id: str, state: _MachineState, boundary: int) -> Window | None:
        state.emitted_until = boundary
        if self.journal is not None:
            self.journal.emitted(machine_id, boundary)
        start = boundary - self._length
        times = state.times
        lo = bisect.bisect_left(times, start)
        hi = bisect.bisect_left(times, boundary)
        window_times, rows, layouts = times[lo:hi], state.rows[lo:hi], state.layouts[lo:hi]
        # Readings before the next window's start are never needed again: drop them to keep memory bounded.
        keep_from = bisect.bisect_left(times, self.keep_from(boundary))
        del times[:keep_from], state.rows[:keep_from], state.layouts[:keep_from]
        self._forget_old_events(state, boundary)
        if len(window_times) < self.spec.min_points:
            return None
        self.emitted += 1
        first = layouts[0]
        if all(layout is first or layout == first for layout in layouts):
            sensors = first
            values = np.array(rows, dtype=np.float32).reshape(len(rows), len(first))
        else:
            sensors = tuple(sorted({name for layout in layouts for name in layout}))
            col = {name: j for j, name in enumerate(sensors)}
            values = np.full((len(rows), len(sensors)), np.nan, dtype=np.float32)
            for r, (layout, row) in enumerate(zip(layouts, rows, strict=True)):
                values[r, [col[name] for name in layout]] = row
        end = datetime.fromtimestamp(boundary, UTC)
        context = [e for e in state.events if e.timestamp < end]
        for e in state.last_maintenance.values():
            if e not in context and e.timestamp < end:
                context.append(e)
        context.sort(key=lambda e: e.timestamp)
        return Window(
            machine_id=machine_id,
            start=datetime.fromtimestamp(start, UTC),
            end=end,
            timestamps=np.asarray(window_times, dtype=np.float64).astype(np.int64),
            sensors=sensors,
            values=values,
            events=tuple(context),
            attributes=dict(self._attributes.get(machine_id, {})),
        )

    def _forget_old_events(self, state: _MachineState, boundary: int) -> None:
        cutoff = boundary - self._lookback
        drop = 0
        while drop < len(state.events) and state.events[drop].timestamp.timestamp() < cutoff:
            drop += 1
        if drop:
            del state.events[:drop]
