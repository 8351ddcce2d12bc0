"""Per-machine windows in event time.

Each machine's readings are cut on a fixed schedule: boundaries fall on multiples of ``every`` since the epoch, and
the window that ends at boundary ``b`` holds the readings with ``b - length <= t < b``. A window is emitted when the
first reading at or after ``b`` arrives, so it is complete as long as readings arrive in order.

The rule for out-of-order and late data (documented, and counted):
- a reading older than the newest reading seen but not older than the last emitted boundary is inserted in time
  order: it still counts for the next window;
- a reading older than the last emitted boundary is *late*: that window was already scored and is never re-scored,
  so the reading is dropped and counted in ``late_dropped``;
- when a machine goes quiet for several periods, only the window at the latest boundary is emitted (no empty
  windows for the gap).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from contracts.messages import Event, TelemetryReading
from edge_agent.config import WindowSpec
from models.scoring import Window


@dataclass
class _MachineState:
    times: list[int] = field(default_factory=list)  # epoch seconds, ascending
    rows: list[Mapping[str, float | None]] = field(default_factory=list)
    events: deque[Event] = field(default_factory=deque)
    last_maintenance: dict[str, Event] = field(default_factory=dict)
    emitted_until: int | None = None  # the last boundary a window was emitted for


class WindowBuilder:
    """Feed readings and events; get back each :class:`Window` as it completes."""

    def __init__(self, spec: WindowSpec, attributes: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.spec = spec
        self._length = int(spec.length.total_seconds())
        self._every = int(spec.every.total_seconds())
        self._lookback = int(spec.event_lookback.total_seconds())
        self._attributes = attributes or {}
        self._machines: dict[str, _MachineState] = {}
        self.late_dropped = 0

    @property
    def machines(self) -> int:
        return len(self._machines)

    def add_event(self, event: Event) -> None:
        state = self._machines.setdefault(event.machine_id, _MachineState())
        state.events.append(event)
        if event.kind == "maintenance" and event.detail:
            # Kept beyond the lookback: "time since last maintenance of each part" is context the model reads.
            state.last_maintenance[event.detail] = event

    def add_reading(self, reading: TelemetryReading) -> Window | None:
        """Adds one reading; returns the window that this reading completed, if any."""
        state = self._machines.setdefault(reading.machine_id, _MachineState())
        t = int(reading.timestamp.timestamp())
        if state.emitted_until is not None and t < state.emitted_until:
            self.late_dropped += 1
            return None
        window = None
        if state.times:
            boundary = (t // self._every) * self._every
            if boundary > state.times[-1] and boundary > (state.emitted_until or -(2**62)):
                window = self._emit(reading.machine_id, state, boundary)
        i = bisect.bisect_right(state.times, t)
        state.times.insert(i, t)
        state.rows.insert(i, reading.values)
        return window

    def _emit(self, machine_id: str, state: _MachineState, boundary: int) -> Window | None:
        state.emitted_until = boundary
        start = boundary - self._length
        lo = bisect.bisect_left(state.times, start)
        # Readings before the next window's start are never needed again: drop them to keep memory bounded.
        keep_from = bisect.bisect_left(state.times, boundary + self._every - self._length)
        times, rows = state.times[lo:], state.rows[lo:]
        del state.times[:keep_from], state.rows[:keep_from]
        while state.events and state.events[0].timestamp.timestamp() < boundary - self._lookback:
            state.events.popleft()
        if len(times) < self.spec.min_points:
            return None
        sensors = tuple(sorted({name for row in rows for name in row}))
        col = {name: j for j, name in enumerate(sensors)}
        values = np.full((len(rows), len(sensors)), np.nan, dtype=np.float32)
        for i, row in enumerate(rows):
            for name, v in row.items():
                if v is not None:
                    values[i, col[name]] = v
        context = [e for e in state.events if e.timestamp.timestamp() < boundary]
        for e in state.last_maintenance.values():
            if e not in context and e.timestamp.timestamp() < boundary:
                context.append(e)
        context.sort(key=lambda e: e.timestamp)
        return Window(
            machine_id=machine_id,
            start=datetime.fromtimestamp(start, UTC),
            end=datetime.fromtimestamp(boundary, UTC),
            timestamps=np.asarray(times, dtype=np.int64),
            sensors=sensors,
            values=values,
            events=tuple(context),
            attributes=dict(self._attributes.get(machine_id, {})),
        )
