"""Write a simulated fleet in the generic input formats, chunk by chunk, so a long run never has to fit in memory.

Files (``.csv`` or ``.jsonl``): ``telemetry`` (time order across machines, as a collector would log it), ``events``,
``machines`` and ``ground_truth`` (every degradation episode and how it ended: for evaluation, not an input format).
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

import numpy as np

from precursor.simulator.config import FleetConfig
from precursor.simulator.engine import Degradation, FleetChunk, FleetEngine
from precursor.simulator.physics import DECIMALS, SENSORS

FileFormat = Literal["csv", "jsonl"]
FORMATS: tuple[str, ...] = ("csv", "jsonl")


@dataclass(frozen=True)
class FleetSummary:
    machines: int
    rows: int
    events_by_type: dict[str, int]
    failures_by_kind: dict[str, int]
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.inf


@dataclass(frozen=True)
class FleetFiles:
    """Where a run was written, and what it holds."""

    telemetry: Path
    events: Path
    machines: Path
    ground_truth: Path
    summary: FleetSummary


def iso(epoch_s: int) -> str:
    """``2026-01-01T00:00:00Z``: the timestamp form every file here uses."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _TableWriter:
    """Rows of named fields to CSV (header first) or JSONL; None is a blank / null."""

    def __init__(self, handle: IO[str], fmt: FileFormat, columns: list[str]) -> None:
        self.handle = handle
        self.columns = columns
        self._csv = csv.writer(handle, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow(columns)

    def write_lines(self, lines: list[str]) -> None:
        """Rows already formatted (the fast path for telemetry)."""
        self.handle.write("".join(lines))

    def write(self, row: list[object]) -> None:
        if self._csv is not None:
            self._csv.writerow(["" if v is None else v for v in row])
        else:
            self.handle.write(json.dumps(dict(zip(self.columns, row, strict=True))) + "\n")


def _telemetry_lines(chunk: FleetChunk, machine_ids: tuple[str, ...], fmt: FileFormat) -> list[str]:
    """The chunk's readings as text lines, ordered by (timestamp, machine)."""
    parts = [p for p in chunk.machines if len(p.timestamps)]
    if not parts:
        return []
    stamps = np.concatenate([p.timestamps for p in parts])
    machines = np.concatenate([np.full(len(p.timestamps), p.machine) for p in parts])
    values = np.concatenate([p.values for p in parts])
    order = np.lexsort((machines, stamps))
    stamps, machines, values = stamps[order], machines[order], values[order]
    times = {int(s): iso(int(s)) for s in np.unique(stamps)}
    columns: list[list[str]] = []
    for j, name in enumerate(SENSORS):
        pattern = f"{{:.{DECIMALS[name]}f}}".format
        null = "" if fmt == "csv" else "null"
        columns.append([null if v != v else pattern(v) for v in values[:, j].tolist()])
    if fmt == "csv":
        return [
            f"{times[s]},{machine_ids[m]},{','.join(cells)}\n"
            for s, m, cells in zip(stamps.tolist(), machines.tolist(), zip(*columns, strict=True), strict=True)
        ]
    keys = [json.dumps(name) for name in SENSORS]
    return [
        f'{{"timestamp": "{times[s]}", "machine_id": {json.dumps(machine_ids[m])}, '
        + ", ".join(f"{k}: {c}" for k, c in zip(keys, cells, strict=True))
        + "}\n"
        for s, m, cells in zip(stamps.tolist(), machines.tolist(), zip(*columns, strict=True), strict=True)
    ]


def _ground_truth_row(d: Degradation) -> list[object]:
    return [
        d.machine_id,
        d.kind,
        d.onset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        None if d.end is None else d.end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        d.outcome,
        d.bound_for_failure,
        d.warning_h,
    ]


def write_fleet(config: FleetConfig, out_dir: str | Path, format: FileFormat = "csv") -> FleetFiles:
    """Simulate ``config`` and write it to ``out_dir`` (created if absent); overwrites earlier files there."""
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {', '.join(FORMATS)}")
    if config.duration is None:
        raise ValueError("duration=None is an endless run: stream it with stream_fleet, or set a duration")
    began = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.{format}" for name in ("telemetry", "events", "machines", "ground_truth")}
    engine = FleetEngine(config)
    machine_ids = config.machine_ids
    rows = 0
    event_types: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    with (
        paths["telemetry"].open("w", encoding="utf-8", newline="") as telemetry_file,
        paths["events"].open("w", encoding="utf-8", newline="") as events_file,
    ):
        telemetry = _TableWriter(telemetry_file, format, ["timestamp", "machine_id", *SENSORS])
        events = _TableWriter(events_file, format, ["timestamp", "machine_id", "event"])
        for chunk in engine.chunks():
            lines = _telemetry_lines(chunk, machine_ids, format)
            telemetry.write_lines(lines)
            rows += len(lines)
            logged = sorted(
                ((at, part.machine, event) for part in chunk.machines for at, event in part.events),
                key=lambda item: (item[0], item[1]),
            )
            for at, machine, event in logged:
                events.write([iso(at), machine_ids[machine], event])
                kind, _, detail = event.partition(":")
                event_types[kind] += 1
                if kind == "failure":
                    failures[detail] += 1
    with paths["machines"].open("w", encoding="utf-8", newline="") as machines_file:
        profiles = engine.profiles
        attribute_names = list(profiles[0].attributes())
        writer = _TableWriter(machines_file, format, ["machine_id", *attribute_names])
        for profile in profiles:
            writer.write([profile.machine_id, *profile.attributes().values()])
    with paths["ground_truth"].open("w", encoding="utf-8", newline="") as truth_file:
        columns = ["machine_id", "kind", "onset", "end", "outcome", "bound_for_failure", "warning_h"]
        writer = _TableWriter(truth_file, format, columns)
        for degradation in engine.degradations():
            writer.write(_ground_truth_row(degradation))
    summary = FleetSummary(
        machines=config.machines,
        rows=rows,
        events_by_type=dict(sorted(event_types.items())),
        failures_by_kind=dict(sorted(failures.items())),
        seconds=time.perf_counter() - began,
    )
    return FleetFiles(paths["telemetry"], paths["events"], paths["machines"], paths["ground_truth"], summary)
