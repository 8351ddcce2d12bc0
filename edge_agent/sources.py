"""Where telemetry comes from. Every source is an iterator of readings, events and unreadable rows.

Sources never raise on a bad row: they yield a :class:`contracts.formats.RowError`, which the agent quarantines.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Protocol

from contracts.formats import RowError, iter_events, iter_telemetry, read_machines
from contracts.messages import Event, TelemetryReading
from edge_agent.config import ReplaySource, SimulatorSource, Source

Item = TelemetryReading | Event | RowError


class TelemetrySource(Protocol):
    def attributes(self) -> dict[str, dict[str, str]]: ...

    def __iter__(self) -> Iterator[Item]: ...


class FileReplay:
    """Replays a telemetry file with its events file.

    Events are interleaved per machine: before a machine's reading at time t, every event of that machine up to t is
    yielded, so the windows see the same context they would have seen live, whatever order the file has across
    machines. Events after a machine's last reading (a failure after the telemetry ends, say) come at the end.
    """

    def __init__(self, spec: ReplaySource) -> None:
        self.spec = spec

    def attributes(self) -> dict[str, dict[str, str]]:
        return read_machines(self.spec.machines) if self.spec.machines else {}

    def __iter__(self) -> Iterator[Item]:
        pending: dict[str, list[Event]] = defaultdict(list)
        if self.spec.events is not None:
            for item in iter_events(self.spec.events):
                if isinstance(item, RowError):
                    yield item
                else:
                    pending[item.machine_id].append(item)
        for events in pending.values():
            events.sort(key=lambda e: e.timestamp, reverse=True)  # pop() from the end = oldest first
        pace = _Pace(self.spec.speedup)
        for item in iter_telemetry(self.spec.telemetry):
            if isinstance(item, TelemetryReading):
                queue = pending.get(item.machine_id)
                while queue and queue[-1].timestamp <= item.timestamp:
                    yield queue.pop()
                pace.wait_until(item.timestamp.timestamp())
            yield item
        leftovers = sorted((e for q in pending.values() for e in q), key=lambda e: (e.timestamp, e.machine_id))
        yield from leftovers


class SimulatedFleet:
    """The built-in simulator, streaming live at an accelerated clock."""

    def __init__(self, spec: SimulatorSource) -> None:
        from simulator.fleet import FleetConfig

        self.spec = spec
        self._config = FleetConfig(
            machines=spec.machines,
            duration=spec.duration,
            interval=spec.interval,
            seed=spec.seed,
            **({"failure_kinds": tuple(spec.kinds)} if spec.kinds else {}),
        )

    def attributes(self) -> dict[str, dict[str, str]]:
        from simulator.fleet import machine_attributes

        return machine_attributes(self._config)

    def __iter__(self) -> Iterator[Item]:
        from simulator.fleet import stream_fleet

        yield from stream_fleet(self._config, speedup=self.spec.speedup or float("inf"))


class _Pace:
    """Sleeps so that event time advances ``speedup`` times faster than wall time; 0 means no pacing."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self._origin: tuple[float, float] | None = None

    def wait_until(self, event_time: float) -> None:
        if self.speedup <= 0:
            return
        if self._origin is None:
            self._origin = (event_time, time.monotonic())
            return
        due = self._origin[1] + (event_time - self._origin[0]) / self.speedup
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def open_source(spec: Source) -> TelemetrySource:
    if isinstance(spec, ReplaySource):
        return FileReplay(spec)
    return SimulatedFleet(spec)
