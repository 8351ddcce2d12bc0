"""The fleet as a live source: readings and events in time order across machines, paced against the wall clock.

The stream is lazy (one chunk of about a day is simulated at a time), so ``duration=None`` runs forever in bounded
memory. For a finite config it yields exactly the readings and events that
:func:`precursor.simulator.fleet.simulate_fleet`
returns. At one instant, a machine's events come before its reading, as a file replay interleaves them.

>>> from precursor.simulator.config import FleetConfig
>>> items = stream_fleet(FleetConfig(machines=2, duration=None, interval="1m"), speedup=0)
>>> [type(next(items)).__name__ for _ in range(3)]
['TelemetryReading', 'TelemetryReading', 'TelemetryReading']
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from precursor.contracts.formats import parse_timestamp
from precursor.contracts.messages import Event, TelemetryReading
from precursor.simulator.config import FleetConfig
from precursor.simulator.engine import FleetChunk, FleetEngine
from precursor.simulator.physics import SENSORS

_EVENT, _READING = 0, 1


def _check_speedup(speedup: float) -> bool:
    """Whether to pace at all; raises on a speedup that means nothing."""
    if math.isnan(speedup) or speedup < 0:
        raise ValueError(f"speedup={speedup} must be positive, or 0 or inf for as fast as possible")
    return 0 < speedup < math.inf


def _chunk_items(chunk: FleetChunk, machine_ids: tuple[str, ...], since: int) -> Iterator[TelemetryReading | Event]:
    keys: list[tuple[int, int, int, int]] = []
    for part in chunk.machines:
        keys.extend((at, _EVENT, part.machine, i) for i, (at, _) in enumerate(part.events) if at >= since)
        keys.extend(
            (int(at), _READING, part.machine, i) for i, at in enumerate(part.timestamps.tolist()) if at >= since
        )
    keys.sort()
    moments: dict[int, datetime] = {}
    for at, rank, machine, i in keys:
        moment = moments.get(at)
        if moment is None:
            moment = moments[at] = datetime.fromtimestamp(at, UTC)
        part = chunk.machines[machine]
        if rank == _EVENT:
            yield Event(timestamp=moment, machine_id=machine_ids[machine], event=part.events[i][1])
        else:
            row = part.values[i].tolist()
            values = {name: None if v != v else v for name, v in zip(SENSORS, row, strict=True)}
            yield TelemetryReading(timestamp=moment, machine_id=machine_ids[machine], values=values)


def stream_fleet(
    config: FleetConfig,
    speedup: float = math.inf,
    start_at: datetime | str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[TelemetryReading | Event]:
    """Readings and events of the fleet, in time order, as simulated time passes ``speedup`` times faster than wall
    time (``0`` or ``inf``: as fast as possible).

    ``start_at`` (simulated time, default ``config.start``) skips the stretch before it: the machines still live
    through it (wear, maintenance, failures), but nothing before it is yielded, and nothing there is rendered.
    """
    paced = _check_speedup(speedup)
    since = config.start_s
    if start_at is not None:
        since = math.ceil(parse_timestamp(start_at).timestamp())
        end = None if config.duration is None else config.start + config.duration
        if since < config.start_s or (end is not None and since >= end.timestamp()):
            raise ValueError(
                f"start_at={start_at} is outside the simulated span starting {config.start.isoformat()}"
                + ("" if end is None else f" and ending {end.isoformat()}")
            )
    engine = FleetEngine(config)
    origin: tuple[int, float] | None = None
    for chunk in engine.chunks(render_from=since, remember=False):
        for item in _chunk_items(chunk, config.machine_ids, since):
            if paced:
                at = int(item.timestamp.timestamp())
                if origin is None:
                    origin = (at, clock())
                else:
                    delay = origin[1] + (at - origin[0]) / speedup - clock()
                    if delay > 0:
                        sleep(delay)
            yield item
