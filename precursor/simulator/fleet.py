"""Simulate a fleet in one go: telemetry as columns, events, machine attributes and the ground truth behind them.

>>> data = simulate_fleet(FleetConfig(machines=2, duration="1d", interval="10m", seed=1))
>>> data.telemetry.values.shape
(288, 7)
>>> data.telemetry.sensors[:3]
['bearing_temp', 'flow', 'motor_current']
>>> sorted(data.machines)
['m-001', 'm-002']
>>> simulate_fleet(FleetConfig(machines=2, duration="1d", interval="10m", seed=1)) == data
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from precursor.contracts.formats import TelemetryTable
from precursor.contracts.messages import Event, TelemetryReading
from precursor.simulator.config import FleetConfig
from precursor.simulator.engine import Degradation, FleetEngine
from precursor.simulator.files import FleetFiles, write_fleet
from precursor.simulator.physics import DECIMALS, SENSORS, machine_profile
from precursor.simulator.stream import stream_fleet

__all__ = [
    "Degradation",
    "FleetConfig",
    "FleetData",
    "FleetFiles",
    "machine_attributes",
    "simulate_fleet",
    "stream_fleet",
    "write_fleet",
]

TABLE_SENSORS: list[str] = sorted(SENSORS)
"""Sensor order in a :class:`TelemetryTable`: alphabetical, as ``precursor.contracts.formats`` builds tables from
files.
"""


@dataclass(frozen=True, eq=False)
class FleetData:
    """A whole simulated run. ``telemetry`` rows are sorted by (machine_id, timestamp), as a TelemetryTable is."""

    config: FleetConfig
    telemetry: TelemetryTable
    events: list[Event]
    """Sorted by (timestamp, machine_id)."""
    machines: dict[str, dict[str, str]]
    degradations: list[Degradation] = field(default_factory=list)
    """Ground truth: every degradation episode, failure-bound or not, and how it ended."""

    def failures(self) -> list[Event]:
        return [e for e in self.events if e.kind == "failure"]

    def failures_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(str(e.detail) for e in self.failures()).items()))

    def readings(self) -> Iterator[TelemetryReading]:
        """Each row as a reading, in table order; blanks become None. Values are exactly what the files hold."""
        table = self.telemetry
        decimals = [DECIMALS[name] for name in table.sensors]
        for i in range(len(table.timestamps)):
            row = table.values[i].tolist()
            yield TelemetryReading(
                timestamp=datetime.fromtimestamp(int(table.timestamps[i]), UTC),
                machine_id=str(table.machine_ids[i]),
                values={
                    # float32 keeps 7 digits: rounding to the sensor's resolution recovers the value as written
                    name: None if v != v else round(v, d)
                    for name, v, d in zip(table.sensors, row, decimals, strict=True)
                },
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FleetData):
            return NotImplemented
        mine, theirs = self.telemetry, other.telemetry
        return (
            self.config == other.config
            and mine.sensors == theirs.sensors
            and np.array_equal(mine.machine_ids, theirs.machine_ids)
            and np.array_equal(mine.timestamps, theirs.timestamps)
            and np.array_equal(mine.values, theirs.values, equal_nan=True)
            and self.events == other.events
            and self.machines == other.machines
            and self.degradations == other.degradations
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: not hashable


def machine_attributes(config: FleetConfig) -> dict[str, dict[str, str]]:
    """machine_id -> static attributes (model, site, install year, age), as the generic machines format holds them."""
    return {
        machine_id: machine_profile(i, machine_id, start_year=config.start.year, seed=config.seed).attributes()
        for i, machine_id in enumerate(config.machine_ids)
    }


def simulate_fleet(config: FleetConfig) -> FleetData:
    """Run the whole simulation in memory. Needs a finite ``duration``; use :func:`stream_fleet` for endless runs."""
    if config.duration is None:
        raise ValueError("duration=None is an endless run: stream it with stream_fleet, or set a duration")
    engine = FleetEngine(config)
    columns = [SENSORS.index(name) for name in TABLE_SENSORS]
    stamps: list[list[np.ndarray]] = [[] for _ in config.machine_ids]
    values: list[list[np.ndarray]] = [[] for _ in config.machine_ids]
    logged: list[tuple[int, int, str]] = []
    for chunk in engine.chunks():
        for part in chunk.machines:
            stamps[part.machine].append(part.timestamps)
            values[part.machine].append(part.values[:, columns])
            logged.extend((at, part.machine, event) for at, event in part.events)
    machine_ids = config.machine_ids
    counts = [sum(len(s) for s in per_machine) for per_machine in stamps]
    table = TelemetryTable(
        machine_ids=np.repeat(np.array(machine_ids, dtype=object), counts),
        timestamps=np.concatenate([s for per_machine in stamps for s in per_machine]).astype(np.int64),
        sensors=list(TABLE_SENSORS),
        values=np.concatenate([v for per_machine in values for v in per_machine]).astype(np.float32),
    )
    logged.sort(key=lambda item: (item[0], item[1]))  # stable: a machine's events keep their order within a second
    events = [
        Event(timestamp=datetime.fromtimestamp(at, UTC), machine_id=machine_ids[machine], event=event)
        for at, machine, event in logged
    ]
    return FleetData(
        config=config,
        telemetry=table,
        events=events,
        machines={p.machine_id: p.attributes() for p in engine.profiles},
        degradations=engine.degradations(),
    )
