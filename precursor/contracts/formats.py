"""The generic input formats: telemetry, events and machines as CSV, JSONL or Parquet.

- telemetry: ``timestamp`` (ISO 8601 or epoch seconds), ``machine_id``, one numeric column per sensor; blank = missing.
- events: ``timestamp``, ``machine_id``, ``event``: ``failure[:KIND]``, ``maintenance:PART``,
  ``error:CODE`` or ``anomaly``.
- machines (optional): ``machine_id`` plus static attributes.

Readers never stop at a bad row: they yield a :class:`RowError` naming the file, line and problem, and carry on, so
the caller can quarantine it and nothing else is lost.

>>> parse_timestamp("2000-01-01T01:00:00Z").isoformat()
'2000-01-01T01:00:00+00:00'
>>> parse_timestamp("946688400").isoformat()
'2000-01-01T01:00:00+00:00'
>>> parse_timestamp("yesterday")
Traceback (most recent call last):
...
ValueError: timestamp 'yesterday' is neither ISO 8601 nor epoch seconds
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from precursor.contracts.messages import ContractError, Event, TelemetryReading, validate

KEY_COLUMNS = ("timestamp", "machine_id")

T = TypeVar("T")


@dataclass(frozen=True)
class RowError:
    """A row that could not be read, with where it came from and why."""

    source: str
    line: int
    raw: str
    reason: str


def parse_timestamp(value: str | float | int | datetime) -> datetime:
    """ISO 8601 (naive means UTC) or epoch seconds, to an aware UTC datetime."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"timestamp {value!r} is not finite")
        return datetime.fromtimestamp(float(value), UTC)
    text = str(value).strip()
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"timestamp {text!r} is neither ISO 8601 nor epoch seconds") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _number(name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if isinstance(value, bool):
        raise ValueError(f"sensor {name}={value!r} is a boolean, not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"sensor {name}={value!r} is not a number") from None
    if math.isnan(number):
        return None
    if not math.isfinite(number):
        raise ValueError(f"sensor {name}={value!r} is not finite")
    return number


def reading_from_row(row: dict[str, Any]) -> TelemetryReading:
    """One generic-format telemetry row (a dict of column -> value) to a validated reading."""
    missing = [c for c in KEY_COLUMNS if row.get(c) in (None, "")]
    if missing:
        raise ValueError(f"missing column(s): {', '.join(missing)}")
    values = {str(k): _number(str(k), v) for k, v in row.items() if k not in KEY_COLUMNS}
    if not values:
        raise ValueError("no sensor columns")
    return validate(
        TelemetryReading,
        {"timestamp": parse_timestamp(row["timestamp"]), "machine_id": str(row["machine_id"]), "values": values},
    )


def _rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None, str | None]]:
    """(line number, raw text, row or None, error or None) for CSV, JSONL or Parquet."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # only where Parquet is used: the edge install may not have pyarrow

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, json.dumps(row, default=str), row, None
        return
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        if suffix in (".jsonl", ".ndjson", ".json"):
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    yield i, line, None, f"not valid JSON: {err.msg}"
                    continue
                if not isinstance(row, dict):
                    yield i, line, None, f"expected a JSON object, got {type(row).__name__}"
                    continue
                yield i, line, row, None
            return
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        for row_values in reader:
            line = reader.line_num
            raw = ",".join(row_values)
            if len(row_values) != len(header):
                yield line, raw, None, f"has {len(row_values)} fields, the header has {len(header)}"
                continue
            yield line, raw, dict(zip(header, row_values, strict=True)), None


def _parsed(path: str | Path, parse: Callable[[dict[str, Any]], T]) -> Iterator[T | RowError]:
    """Each row of a CSV file through ``parse``, or a :class:`RowError` where the row or its parsing failed."""
    path = Path(path)
    for line, raw, row, error in _rows(path):
        if row is None:
            yield RowError(str(path), line, raw, error or "unreadable")
            continue
        try:
            yield parse(row)
        except (ValueError, ContractError) as err:
            yield RowError(str(path), line, raw, str(err))


def iter_telemetry(path: str | Path) -> Iterator[TelemetryReading | RowError]:
    """Each row of a telemetry file as a reading, or a :class:`RowError` saying what was wrong with it."""
    return _parsed(path, reading_from_row)


def event_from_row(row: dict[str, Any]) -> Event:
    """One row of an events file (timestamp, machine_id, event) as an :class:`Event`."""
    return validate(
        Event,
        {
            "timestamp": parse_timestamp(row.get("timestamp", "")),
            "machine_id": row.get("machine_id"),
            "event": str(row.get("event", "")).strip(),
        },
    )


def iter_events(path: str | Path) -> Iterator[Event | RowError]:
    """Each row of an events file as an event, or a :class:`RowError` saying what was wrong with it."""
    return _parsed(path, event_from_row)


def read_events(path: str | Path) -> list[Event]:
    """All events of a file, sorted by time; raises on the first bad row (for training, where data must be clean)."""
    events: list[Event] = []
    for item in iter_events(path):
        if isinstance(item, RowError):
            raise ContractError(f"{item.source}:{item.line}: {item.reason}")
        events.append(item)
    return sorted(events, key=lambda e: (e.timestamp, e.machine_id))


def read_machines(path: str | Path | None) -> dict[str, dict[str, str]]:
    """machine_id -> static attributes (all as text). An absent file means no attributes."""
    if path is None:
        return {}
    machines: dict[str, dict[str, str]] = {}
    for _, _, row, error in _rows(Path(path)):
        if row is None or not row.get("machine_id"):
            raise ContractError(f"{path}: bad machines row ({error or 'no machine_id'})")
        machine_id = str(row.pop("machine_id"))
        machines[machine_id] = {str(k): str(v) for k, v in row.items() if v not in (None, "")}
    return machines


@dataclass
class TelemetryTable:
    """Telemetry as columns, for training and evaluation: rows sorted by (machine_id, timestamp).

    ``values[i, j]`` is sensor ``sensors[j]`` at row ``i``; NaN where the reading is missing.
    """

    machine_ids: np.ndarray  # (N,) str
    timestamps: np.ndarray  # (N,) int64 epoch seconds
    sensors: list[str]
    values: np.ndarray  # (N, S) float32

    def machines(self) -> Iterator[tuple[str, slice]]:
        """Each machine with the slice of its rows (rows are sorted, so each machine is one run)."""
        if len(self.machine_ids) == 0:
            return
        change = np.flatnonzero(self.machine_ids[1:] != self.machine_ids[:-1]) + 1
        bounds = [0, *change.tolist(), len(self.machine_ids)]
        for lo, hi in itertools.pairwise(bounds):
            yield str(self.machine_ids[lo]), slice(lo, hi)


def telemetry_table(readings: Iterable[TelemetryReading]) -> TelemetryTable:
    rows = list(readings)
    sensors = sorted({name for r in rows for name in r.values})
    col = {name: j for j, name in enumerate(sensors)}
    rows.sort(key=lambda r: (r.machine_id, r.timestamp))
    values = np.full((len(rows), len(sensors)), np.nan, dtype=np.float32)
    for i, r in enumerate(rows):
        for name, v in r.values.items():
            if v is not None:
                values[i, col[name]] = v
    return TelemetryTable(
        machine_ids=np.array([r.machine_id for r in rows], dtype=object),
        timestamps=np.array([int(r.timestamp.timestamp()) for r in rows], dtype=np.int64),
        sensors=sensors,
        values=values,
    )


def read_telemetry_table(path: str | Path) -> TelemetryTable:
    """A whole telemetry file as columns; raises on the first bad row (training data must be clean)."""
    readings: list[TelemetryReading] = []
    for item in iter_telemetry(path):
        if isinstance(item, RowError):
            raise ContractError(f"{item.source}:{item.line}: {item.reason}")
        readings.append(item)
    return telemetry_table(readings)
