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
persist the open windows with the outbox and :meth:`WindowBuilder.restore` them after a restart. A
:class:`BoundaryObserver` is shown a machine's held readings at each boundary, before the oldest are forgotten (the
telemetry summaries are cut there).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain
from typing import Protocol

import numpy as np

from edge_agent.config import WindowSpec
from edge_agent.parsing import Reading
from models.edge.scoring import Window
from precursor.contracts.messages import Event, TelemetryReading


class WindowJournal(Protocol):
    """Told of each change to the builder's state that a restart would need.

    A journal may also have ``accepted_many(readings: list[Reading])``, for several readings accepted in order (the
    list is the builder's to reuse once it returns); the builder then uses it instead of :meth:`accepted`.
    """

    def accepted(self, reading: Reading) -> None: ...

    def emitted(self, machine_id: str, boundary: int) -> None: ...

    def event(self, event: Event) -> None: ...


class BoundaryObserver(Protocol):
    """Shown a machine's held readings each time the builder passes one of its boundaries, before the builder
    forgets the ones no later window needs (:class:`~edge_agent.summaries.TelemetrySummarizer` is one).

    ``previous`` is the boundary passed before (None for the machine's first), as the journal keeps it; every held
    reading is earlier than ``boundary``. The lists are the builder's own: read them, never keep or change them.
    """

    def passed(
        self,
        machine_id: str,
        previous: int | None,
        boundary: int,
        times: list[float],
        rows: list[tuple[float, ...]],
        layouts: list[tuple[str, ...]],
    ) -> None: ...


def value_matrix(
    rows: list[tuple[float, ...]], layouts: list[tuple[str, ...]], dtype: type = np.float32
) -> tuple[tuple[str, ...], np.ndarray]:
    """(sensors, values) of readings that may have different sensors: one column per sensor, NaN where missing."""
    first = layouts[0]
    if all(layout is first or layout == first for layout in layouts):
        # The values as one flat stream: cheaper than numpy working out the shape of a list of tuples.
        flat = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=len(rows) * len(first))
        return first, flat.reshape(len(rows), len(first))
    sensors = tuple(sorted({name for layout in layouts for name in layout}))
    col = {name: j for j, name in enumerate(sensors)}
    values = np.full((len(rows), len(sensors)), np.nan, dtype=dtype)
    for r, (layout, row) in enumerate(zip(layouts, rows, strict=True)):
        values[r, [col[name] for name in layout]] = row
    return sensors, values


@dataclass(slots=True)
class _MachineState:
    # Parallel lists rather than the Reading tuples themselves: a NamedTuple instance stays tracked by the garbage
    # collector for good, and a minute of readings of every machine held as such makes each full collection walk
    # them all (tens of ms, straight into the latency); plain floats and tuples of floats are untracked.
    times: list[float] = field(default_factory=list)  # epoch seconds, ascending, one reading per instant
    rows: list[tuple[float, ...]] = field(default_factory=list)
    layouts: list[tuple[str, ...]] = field(default_factory=list)  # the sensors of each row
    due: float = math.inf
    """The reading time from which the next reading emits a window: the first boundary past both the newest reading
    and ``emitted_until`` (inf with no readings: a machine's first reading never emits). Kept, not worked out per
    reading, as it only moves when a window is emitted or the state is restored."""
    events: list[Event] = field(default_factory=list)  # by time
    last_maintenance: dict[str, Event] = field(default_factory=dict)
    emitted_until: int | None = None  # the last boundary a window was emitted for


def _teller(journal: WindowJournal) -> Callable[[list[Reading]], None]:
    """How to tell ``journal`` of accepted readings: all at once where it can hear them so."""
    many = getattr(journal, "accepted_many", None)
    if many is not None:
        return many  # type: ignore[no-any-return]

    def one_by_one(readings: list[Reading]) -> None:
        for reading in readings:
            journal.accepted(reading)

    return one_by_one


class WindowBuilder:
    """Feed readings and events; get back each :class:`Window` as it completes."""

    def __init__(
        self,
        spec: WindowSpec,
        attributes: Mapping[str, Mapping[str, str]] | None = None,
        journal: WindowJournal | None = None,
        observer: BoundaryObserver | None = None,
    ) -> None:
        self.spec = spec
        self.journal = journal
        self.observer = observer
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
        for window in self.add_readings((reading,)):
            return window
        return None

    def add_readings(self, readings: Iterable[Reading]) -> Iterator[Window]:
        """Adds readings in order, the same as :meth:`add_reading` one at a time; yields each window as the reading
        that completes it is added. Before a window is yielded the journal has heard of every reading accepted so
        far, so the caller may commit there.

        One loop for a source's whole batch: a reading that arrives in order, before its machine's next boundary
        (59 of 60 with one-minute windows of one-second readings), costs a dictionary look-up, two comparisons and
        four list appends.
        """
        machines = self._machines
        accepted: list[Reading] = []
        keep = accepted.append
        tell = None if self.journal is None else _teller(self.journal)
        for reading in readings:
            machine_id, t, sensors, values = reading
            state = machines.get(machine_id)
            if state is None:
                state = machines[machine_id] = _MachineState()
            times = state.times
            if times and t > times[-1]:  # in order (the usual case)
                if t < state.due:
                    emitted = state.emitted_until
                    if emitted is not None and t < emitted:
                        self.late_dropped += 1
                        continue
                    times.append(t)
                    state.rows.append(values)
                    state.layouts.append(sensors)
                    keep(reading)
                    continue
                boundary = int(t // self._every) * self._every
                window = self._emit(machine_id, state, boundary)
                times.append(t)
                state.rows.append(values)
                state.layouts.append(sensors)
                state.due = boundary + self._every  # the newest reading and emitted_until are both under it
                keep(reading)
                if window is not None:
                    if tell is not None:
                        tell(accepted)
                        accepted.clear()
                    yield window
                continue
            emitted = state.emitted_until
            if emitted is not None and t < emitted:
                self.late_dropped += 1
                continue
            if not times:
                state.due = self._due(t, emitted)
                i = 0
            else:
                i = bisect.bisect_left(times, t)
                if times[i] == t:
                    self.repeats_dropped += 1
                    continue
            times.insert(i, t)
            state.rows.insert(i, values)
            state.layouts.insert(i, sensors)
            keep(reading)
        if tell is not None and accepted:
            tell(accepted)

    def _due(self, newest: float, emitted_until: int | None) -> float:
        """The first boundary past the newest reading and past ``emitted_until``."""
        due = (int(newest // self._every) + 1) * self._every
        if emitted_until is not None:
            due = max(due, (int(emitted_until // self._every) + 1) * self._every)
        return due

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
            for state in self._machines.values():
                if state.times:
                    state.due = self._due(state.times[-1], state.emitted_until)
        finally:
            self.journal = journal

    def _emit(self, machine_id: str, state: _MachineState, boundary: int) -> Window | None:
        previous, state.emitted_until = state.emitted_until, boundary
        if self.journal is not None:
            self.journal.emitted(machine_id, boundary)
        start = boundary - self._length
        times = state.times
        if self.observer is not None:
            self.observer.passed(machine_id, previous, boundary, times, state.rows, state.layouts)
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
        sensors, values = value_matrix(rows, layouts)
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
            timestamps=np.array(window_times, dtype=np.float64).astype(np.int64),
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
