"""A fault planted on one sensor: the fleet's degradations shown by that sensor alone, for judging explanations.

An explanation of a prediction can be checked only where the cause is known. :func:`plant_fault` takes a simulated
fleet whose degradations show in no sensor (``sensor_signature=0``) and makes one sensor carry each of them: its
readings grow by ``strength`` times the episode's progress, from onset to its end (the failure), so whatever a model
learns to foresee these failures by, it learns from that sensor. :func:`write_fleet_files` writes the result in the
generic formats.

>>> from precursor.simulator.config import FleetConfig
>>> from precursor.simulator.fleet import simulate_fleet
>>> data = simulate_fleet(FleetConfig(machines=2, duration="4d", interval="30m", seed=1, sensor_signature=0.0))
>>> planted = plant_fault(data, "vibration_rms", strength=2.0)
>>> j = data.telemetry.sensors.index("vibration_rms")
>>> before, after = (np.nan_to_num(d.telemetry.values[:, j]) for d in (data, planted))
>>> bool((after >= before).all()), bool((after > before).any())
(True, True)
>>> plant_fault(data, "smell")
Traceback (most recent call last):
...
ValueError: no sensor 'smell' to plant a fault on; sensors: bearing_temp, flow, motor_current, ...
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from precursor.contracts.messages import Event
from precursor.simulator.fleet import FleetData
from precursor.simulator.physics import DECIMALS


def plant_fault(data: FleetData, sensor: str, *, strength: float = 2.0) -> FleetData:
    """``data`` with ``sensor`` multiplied by ``1 + strength * progress`` during each degradation episode, where
    progress runs from 0 at onset to 1 after the episode's planned warning time (its failure, for one bound to fail)."""
    table = data.telemetry
    if sensor not in table.sensors:
        shown = ", ".join(table.sensors[:3])
        raise ValueError(f"no sensor {sensor!r} to plant a fault on; sensors: {shown}, ...")
    j = table.sensors.index(sensor)
    values = table.values.copy()
    stamps = table.timestamps.astype(np.float64)
    for episode in data.degradations:
        onset = episode.onset.timestamp()
        end = episode.end.timestamp() if episode.end is not None else np.inf
        rows = np.flatnonzero((table.machine_ids == episode.machine_id) & (stamps >= onset) & (stamps < end))
        progress = np.clip((stamps[rows] - onset) / max(episode.warning_h * 3600.0, 1.0), 0.0, 1.0)
        values[rows, j] = np.round(values[rows, j] * (1.0 + strength * progress), DECIMALS.get(sensor, 3))
    return dataclasses.replace(data, telemetry=dataclasses.replace(table, values=values.astype(np.float32)))


def write_fleet_files(
    data: FleetData, out_dir: str | Path, *, keep_event: Callable[[Event], bool] = lambda e: True
) -> dict[str, Path]:
    """``telemetry.csv``, ``events.csv`` (the events ``keep_event`` keeps) and ``machines.csv`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.csv" for name in ("telemetry", "events", "machines")}
    table = data.telemetry
    decimals = [DECIMALS.get(name, 4) for name in table.sensors]
    with paths["telemetry"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "machine_id", *table.sensors])
        for machine, stamp, row in zip(table.machine_ids, table.timestamps, table.values.tolist(), strict=True):
            cells = ["" if v != v else f"{v:.{d}f}" for v, d in zip(row, decimals, strict=True)]
            writer.writerow([int(stamp), machine, *cells])
    with paths["events"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "machine_id", "event"])
        for e in data.events:
            if keep_event(e):
                writer.writerow([e.timestamp.isoformat(), e.machine_id, e.event])
    with paths["machines"].open("w", newline="") as fh:
        keys = sorted({k for attributes in data.machines.values() for k in attributes})
        writer = csv.writer(fh)
        writer.writerow(["machine_id", *keys])
        for machine, attributes in sorted(data.machines.items()):
            writer.writerow([machine, *(attributes.get(k, "") for k in keys)])
    return paths
