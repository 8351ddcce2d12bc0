"""Raw records (CSV lines, JSON objects, MQTT payloads) to readings and events, cheaply, with a reason for each bad one.

The agent's hot path never builds a pydantic model per reading: a :class:`Reading` is a named tuple, made after the
same checks the contract makes (identifiers, finite numbers, a timestamp), so 50,000 readings a second fit on one
core. Each record is either good or a :class:`~precursor.contracts.formats.RowError` that names the field and value at
fault:

- a blank CSV field or a JSON ``null`` is a missing value; anything else must be a finite number: text, booleans,
  ``NaN`` and ``Infinity`` quarantine the record (Parquet is the exception: dataframes store missing floats as NaN);
- ``timestamp`` is ISO 8601 (naive means UTC) or epoch seconds; ``machine_id`` and sensor names follow the contract;
- a record with an ``event`` field is an event (``failure[:KIND]``, ``maintenance:PART``, ``error:CODE``, ``anomaly``).

>>> parser = RecordParser("demo")
>>> layout = parser.csv_layout(["timestamp", "machine_id", "vib", "temp"])
>>> parser.csv_row(layout, ["2026-01-01T00:00:00Z", "pump-1", "0.5", ""], 2, "")
Reading(machine_id='pump-1', t=1767225600.0, sensors=('temp', 'vib'), values=(nan, 0.5))
>>> parser.csv_row(layout, ["2026-01-01T00:00:00Z", "pump-1", "NaN", "1"], 3, "").reason
"sensor vib='NaN' is not a finite number"
>>> parser.json_line('{"timestamp": 1767225600, "machine_id": "pump-1", "temp": true}', 4)[0].reason
'sensor temp=True is a boolean, not a number'
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from precursor.contracts.formats import RowError
from precursor.contracts.messages import EVENT_PATTERN, ContractError, Event, TelemetryReading, validate

KEY_COLUMNS = ("timestamp", "machine_id")
EVENT_COLUMN = "event"
MISSING = math.nan
_IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")  # precursor.contracts.messages.Identifier
_SENSOR = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")  # precursor.contracts.messages.SensorName
_MAX_CACHED = 100_000
_EPOCH_MAX = 253402300799.0  # 9999-12-31T23:59:59Z
_SHOWN = 60
FLOAT32_MAX = 3.4028234663852886e38
"""Windows hold float32: a larger magnitude, finite in float64 (1e308, say), would become an infinity there."""


class Reading(NamedTuple):
    """One machine's sensor values at one instant; ``values[i]`` belongs to ``sensors[i]`` and NaN is missing.

    ``t`` is epoch seconds. Sensors are sorted by name, and records of one layout share one ``sensors`` tuple.
    """

    machine_id: str
    t: float
    sensors: tuple[str, ...]
    values: tuple[float, ...]

    @classmethod
    def from_contract(cls, reading: TelemetryReading) -> Reading:
        names = tuple(sorted(reading.values))
        values = tuple(MISSING if reading.values[n] is None else float(reading.values[n]) for n in names)  # type: ignore[arg-type]
        return cls(reading.machine_id, reading.timestamp.timestamp(), names, values)


Record = Reading | Event | RowError
_new_reading = tuple.__new__  # a Reading without NamedTuple's Python-level __new__: the hot path makes 50,000 a second


def csv_fields(line: str) -> list[str]:
    """The fields of one CSV line; quoted fields take the csv module's slower path. Raises ValueError for a line the
    csv module refuses (a carriage return inside an unquoted field, a field over its size limit)."""
    if '"' not in line:
        return line.split(",")
    try:
        return next(csv.reader([line]), [])
    except csv.Error as err:
        raise ValueError(f"not a CSV line: {err}") from None


def _picker(columns: tuple[int, ...]) -> Callable[[list[str]], tuple[str, ...]]:
    if len(columns) >= 2:
        return itemgetter(*columns)  # type: ignore[return-value]
    return lambda fields: tuple(fields[i] for i in columns)


def _fits(values: tuple[float, ...] | list[float]) -> bool:
    """Whether values are all finite numbers that float32 holds, in one C-level pass.

    Their Euclidean norm is at least the largest magnitude, NaN with a NaN and infinite with an infinity, and it
    never overflows on the way. False for many values close to float32's limit too: the caller then checks value by
    value, which says exactly which one is wrong, if any.
    """
    return math.hypot(*values) <= FLOAT32_MAX


def _beyond_float32(name: str, value: object) -> str:
    return f"sensor {name}={_show(value)} is too large: beyond float32's range (|x| <= 3.4e38) that windows hold"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


@dataclass(frozen=True)
class CsvLayout:
    """Where the key columns and sensors are in a CSV header; sensors in name order, with their column index."""

    header: tuple[str, ...]
    timestamp: int
    machine_id: int
    event: int | None
    sensors: tuple[str, ...]
    columns: tuple[int, ...]
    error: str | None = None
    pick: Callable[[list[str]], tuple[str, ...]] = field(default=lambda fields: (), repr=False, compare=False)
    """The sensor fields of a row, in sensor order."""


_NO_STAMP = object()


class RecordParser:
    """Parses the records of one source. Keeps small caches (timestamps, identifiers, sensor layouts)."""

    def __init__(self, source: str, *, max_sensors: int = 512, max_record_bytes: int = 64 * 1024) -> None:
        self.source = source
        self.max_sensors = max_sensors
        self.max_record_bytes = max_record_bytes
        # The last timestamp parsed, to skip re-parsing a repeated one. It starts as a value no field can equal: an
        # empty or any other text must be parsed (and refused) the first time it comes.
        self._last_stamp: tuple[object, float] = (_NO_STAMP, 0.0)
        self._identifiers: set[str] = set()
        self._layouts: dict[tuple[str, ...], tuple[str, ...]] = {}

    # --- fields -------------------------------------------------------------------------------------------------

    def timestamp(self, value: object) -> float:
        """Epoch seconds from ISO 8601 text or a number; raises ValueError naming the value."""
        last_raw, last_t = self._last_stamp
        if value == last_raw and type(value) is type(last_raw):
            return last_t
        if isinstance(value, datetime):
            t = (value.replace(tzinfo=UTC) if value.tzinfo is None else value).timestamp()
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"timestamp={_show(value)} is neither ISO 8601 text nor epoch seconds")
        else:
            try:
                t = float(value)
            except OverflowError:  # an integer beyond float's range (a 400-digit number, say)
                t = math.inf
            except ValueError:
                text = str(value).strip()
                try:
                    parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
                except ValueError:
                    raise ValueError(f"timestamp={_show(value)} is neither ISO 8601 nor epoch seconds") from None
                if parsed.tzinfo is None:
                    parsed = parsed.replace(tzinfo=UTC)
                t = parsed.timestamp()
        if not (0.0 <= t <= _EPOCH_MAX):  # also catches NaN
            raise ValueError(f"timestamp={_show(value)} is not a time between 1970 and 9999")
        self._last_stamp = (value, t)
        return t

    def machine_id(self, value: object) -> str:
        if isinstance(value, str) and value in self._identifiers:
            return value
        if not isinstance(value, str):
            raise ValueError(f"machine_id={_show(value)} is not text")
        if not value or len(value) > 128 or not _IDENTIFIER.match(value):
            raise ValueError(
                f"machine_id={_show(value)} is not an identifier (1-128 letters, digits, '_', '.', ':', '-')"
            )
        if len(self._identifiers) >= _MAX_CACHED:
            self._identifiers.clear()
        self._identifiers.add(value)
        return value

    def sensor_names(self, names: Iterable[str]) -> tuple[str, ...]:
        """A shared, sorted tuple of checked sensor names."""
        key = tuple(names)
        known = self._layouts.get(key)
        if known is not None:
            return known
        if len(key) > self.max_sensors:
            raise ValueError(f"{len(key)} sensors, more than max_sensors={self.max_sensors}")
        for name in key:
            if not isinstance(name, str) or not name or len(name) > 64 or not _SENSOR.match(name):
                raise ValueError(
                    f"sensor name {_show(name)} is not valid (a letter or '_' first, then letters, digits, '_.-')"
                )
        if len(set(key)) != len(key):
            raise ValueError(f"sensor names repeat: {_show(sorted(key))}")
        if len(self._layouts) >= _MAX_CACHED:
            self._layouts.clear()
        self._layouts[key] = key
        return key

    # --- CSV ----------------------------------------------------------------------------------------------------

    def csv_header(self, text: str) -> CsvLayout:
        """The layout of a header line's text (its line end stripped, a byte order mark allowed); never raises."""
        try:
            return self.csv_layout(csv_fields(text.removeprefix("\ufeff")))
        except ValueError as err:
            return CsvLayout((), -1, -1, None, (), (), error=f"bad CSV header {_show(text)}: {err}")

    def csv_text(self, layout: CsvLayout, text: str, line: int) -> Record:
        """The record of one CSV line's text (its line end stripped); never raises."""
        try:
            fields = csv_fields(text)
        except ValueError as err:
            return RowError(self.source, line, text, str(err))
        return self.csv_row(layout, fields, line, text)

    def csv_layout(self, header: list[str]) -> CsvLayout:
        """The layout of a header line. A bad header gives a layout with ``error`` set: every row is then refused."""
        names = tuple(h.strip() for h in header)
        missing = [c for c in KEY_COLUMNS if c not in names]
        try:
            if missing:
                raise ValueError(f"header lacks column(s) {', '.join(missing)}")
            skip = {*KEY_COLUMNS, EVENT_COLUMN}
            order = sorted((n, i) for i, n in enumerate(names) if n not in skip)
            sensors = self.sensor_names(n for n, _ in order)
            if not sensors and EVENT_COLUMN not in names:
                raise ValueError("header has no sensor columns and no event column")
        except ValueError as err:
            return CsvLayout(names, -1, -1, None, (), (), error=f"bad CSV header {_show(list(names))}: {err}")
        return CsvLayout(
            header=names,
            timestamp=names.index("timestamp"),
            machine_id=names.index("machine_id"),
            event=names.index(EVENT_COLUMN) if EVENT_COLUMN in names else None,
            sensors=sensors,
            columns=tuple(i for _, i in order),
            pick=_picker(tuple(i for _, i in order)),
        )

    def csv_row(self, layout: CsvLayout, fields: list[str], line: int, raw: str) -> Record:
        if layout.error:
            return RowError(self.source, line, raw, layout.error)
        if len(fields) != len(layout.header):
            return RowError(self.source, line, raw, f"has {len(fields)} fields, the header has {len(layout.header)}")
        try:
            t = self.timestamp(fields[layout.timestamp])
            machine = self.machine_id(fields[layout.machine_id])
            if layout.event is not None and fields[layout.event].strip():
                return self._event(t, machine, fields[layout.event].strip())
            if not layout.sensors:
                raise ValueError("the event field is blank")
            texts = layout.pick(fields)
            try:
                values = tuple(map(float, texts))  # the usual row: every field a number
            except ValueError:
                values = self._csv_values(layout.sensors, texts)  # blanks (missing) or a bad field: say which
            else:
                if not _fits(values):  # a NaN, an infinity or a value float32 cannot hold: say which
                    values = self._csv_values(layout.sensors, texts)
        except ValueError as err:
            return RowError(self.source, line, raw, str(err))
        except Exception as err:  # one record must never stop a source: it is quarantined, saying why
            return self._unreadable(line, raw, err)
        return _new_reading(Reading, (machine, t, layout.sensors, values))

    @staticmethod
    def _csv_values(sensors: tuple[str, ...], texts: tuple[str, ...]) -> tuple[float, ...]:
        values = []
        for name, text in zip(sensors, texts, strict=True):
            if not text or text.isspace():
                values.append(MISSING)
                continue
            try:
                v = float(text)
            except ValueError:
                raise ValueError(f"sensor {name}={_show(text)} is not a number") from None
            if v - v != 0.0:
                raise ValueError(f"sensor {name}={_show(text)} is not a finite number")
            if not -FLOAT32_MAX <= v <= FLOAT32_MAX:
                raise ValueError(_beyond_float32(name, text))
            values.append(v)
        return tuple(values)

    def csv_block(self, layout: CsvLayout, rows: list[str]) -> list[Record] | None:
        """The readings of CSV rows (no line ends) when every row is the usual one: the header's number of fields,
        no quotes, a valid timestamp and machine id, every sensor field a finite number. None otherwise (the caller
        then goes row by row, which finds the bad rows and says why): the result, when there is one, is exactly what
        :meth:`csv_row` gives row by row.

        Why by block: a row costs about 12 ``str`` objects and 10 ``float`` calls whatever is done, but split once
        for the block, converted a column at a time and zipped back into rows, nothing of it runs in the
        interpreter's loop, which is most of what the row-by-row shortcut costs beyond that.
        """
        if not rows or layout.error or layout.event is not None or not layout.sensors:
            return None
        width = len(layout.header)
        body = "\n".join(rows)
        # One comma count per row proves every row has the header's width: a total alone would let a row with an
        # extra field and one short of a field pass together, every field after them read from the wrong column.
        if (
            '"' in body
            or "\r" in body
            or body.count("\n") != len(rows) - 1
            or set(map(str.count, rows, repeat(","))) != {width - 1}
        ):
            return None
        fields = body.replace("\n", ",").split(",")
        stamps = fields[layout.timestamp :: width]
        machines = fields[layout.machine_id :: width]
        try:
            distinct = set(stamps)
            if len(distinct) == 1:
                times: Iterable[float] = repeat(self.timestamp(stamps[0]))
            else:
                at = {stamp: self.timestamp(stamp) for stamp in distinct}
                times = map(at.__getitem__, stamps)
            for machine in set(machines).difference(self._identifiers):
                self.machine_id(machine)
            columns = [list(map(float, fields[c::width])) for c in layout.columns]
        except ValueError:
            return None
        if not all(map(_fits, columns)):  # a NaN, an infinity or a value float32 cannot hold somewhere
            return None
        return list(
            map(_new_reading, repeat(Reading), zip(machines, times, repeat(layout.sensors), zip(*columns, strict=True)))
        )

    def csv_lines(self, layout: CsvLayout, lines: list[str], first_line: int) -> list[Record]:
        """The records of consecutive CSV lines (newlines included; blank lines skipped). The same result as
        :meth:`csv_row` line by line: a block of usual rows goes through :meth:`csv_block`, and a block with an
        unusual row goes line by line, the usual row (a known timestamp and machine, every field a finite number)
        taking a shortcut there."""
        rows = list(map(str.rstrip, lines, repeat("\r\n")))
        if "" not in rows:  # a blank line is skipped, which the line-by-line path does
            block = self.csv_block(layout, rows)
            if block is not None:
                return block
        out: list[Record] = []
        append = out.append
        if layout.error or layout.event is not None or not layout.sensors:
            for n, text in enumerate(lines, start=first_line):
                text = text.rstrip("\r\n")
                if text:
                    append(self.csv_text(layout, text, n))
            return out
        width, ts_at, machine_at = len(layout.header), layout.timestamp, layout.machine_id
        pick, sensors, known = layout.pick, layout.sensors, self._identifiers
        last_raw, last_t = self._last_stamp
        for n, text in enumerate(lines, start=first_line):
            text = text.rstrip("\r\n")
            if not text:
                continue
            if '"' in text:
                append(self.csv_text(layout, text, n))
                last_raw, last_t = self._last_stamp
                continue
            fields = text.split(",")
            if len(fields) == width and fields[ts_at] == last_raw and fields[machine_at] in known:
                try:
                    values = tuple(map(float, pick(fields)))
                except ValueError:
                    values = ()
                if values and _fits(values):
                    append(_new_reading(Reading, (fields[machine_at], last_t, sensors, values)))
                    continue
            append(self.csv_row(layout, fields, n, text))  # the long way, with the reason if it is bad
            last_raw, last_t = self._last_stamp
        return out

    # --- JSON ---------------------------------------------------------------------------------------------------

    def json_line(self, text: str | bytes, line: int) -> list[Record]:
        """One JSON text: an object, or an array of objects (a gateway's batch). Never raises: whatever the text, each
        record comes back as a reading, an event or a :class:`RowError` that says what is wrong."""
        raw = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
        try:
            if len(raw) > self.max_record_bytes:
                return [RowError(self.source, line, raw[:4096], f"record of {len(raw)} bytes, over max_record_bytes")]
            if isinstance(text, bytes):
                try:
                    text = text.decode("utf-8-sig")  # json.loads would also take UTF-16 and UTF-32: the format is UTF-8
                except UnicodeDecodeError as err:
                    return [RowError(self.source, line, raw[:4096], f"not valid UTF-8: {err}")]
            try:
                data = json.loads(text.removeprefix("\ufeff"))
            except RecursionError:
                return [RowError(self.source, line, raw[:4096], "not valid JSON: nested too deeply")]
            except ValueError as err:  # a syntax error, or an integer of more digits than Python converts (4,300)
                return [RowError(self.source, line, raw[:4096], f"not valid JSON: {getattr(err, 'msg', err)}")]
            if isinstance(data, list):
                if not data:
                    return [RowError(self.source, line, raw, "an empty JSON array")]
                return [self.json_record(item, line, raw) for item in data]
            return [self.json_record(data, line, raw)]
        except Exception as err:  # one record must never stop a source: it is quarantined, saying why
            return [self._unreadable(line, raw, err)]

    def _unreadable(self, line: int, raw: str, err: Exception) -> RowError:
        return RowError(self.source, line, raw[:4096], f"unreadable record ({type(err).__name__}: {_show(str(err))})")

    def json_record(self, data: Any, line: int, raw: str, *, nan_is_missing: bool = False) -> Record:
        """A decoded object in the generic format: flat sensors, or sensors under ``values``; or an event."""
        if not isinstance(data, dict):
            return RowError(self.source, line, raw, f"expected a JSON object, got {type(data).__name__}")
        try:
            missing = [k for k in KEY_COLUMNS if data.get(k) is None or data.get(k) == ""]
            if missing:
                raise ValueError(f"missing field(s): {', '.join(missing)}")
            t = self.timestamp(data["timestamp"])
            machine = self.machine_id(data["machine_id"])
            if EVENT_COLUMN in data and data[EVENT_COLUMN] not in (None, ""):
                extra = sorted(set(data) - {*KEY_COLUMNS, EVENT_COLUMN})
                if extra:
                    raise ValueError(f"an event has unexpected field(s): {_show(extra)}")
                if not isinstance(data[EVENT_COLUMN], str):
                    raise ValueError(f"event={_show(data[EVENT_COLUMN])} is not text")
                return self._event(t, machine, data[EVENT_COLUMN].strip())
            values = self._values_of(data)
            names = sorted(values)
            sensors = self.sensor_names(names)
            return Reading(machine, t, sensors, tuple(self._number(n, values[n], nan_is_missing) for n in names))
        except ValueError as err:
            return RowError(self.source, line, raw, str(err))
        except Exception as err:  # one record must never stop a source: it is quarantined, saying why
            return self._unreadable(line, raw, err)

    def _values_of(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        if "values" in data:
            extra = sorted(set(data) - {*KEY_COLUMNS, "values"})
            if extra:
                raise ValueError(f"unexpected field(s) beside values: {_show(extra)}")
            values = data["values"]
            if not isinstance(values, dict):
                raise ValueError(f"values={_show(values)} is not an object of sensor -> number")
        else:
            values = {k: v for k, v in data.items() if k not in KEY_COLUMNS and k != EVENT_COLUMN}
        if not values:
            raise ValueError("no sensor values")
        return values

    @staticmethod
    def _number(name: str, value: Any, nan_is_missing: bool) -> float:
        if value is None:
            return MISSING
        if isinstance(value, bool):
            raise ValueError(f"sensor {name}={value!r} is a boolean, not a number")
        if isinstance(value, str):
            raise ValueError(f"sensor {name}={_show(value)} is text, not a number")
        if not isinstance(value, int | float):
            raise ValueError(f"sensor {name}={_show(value)} is a {type(value).__name__}, not a number")
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"sensor {name}={_show(value)} is too large") from None
        if number - number != 0.0:
            if nan_is_missing and math.isnan(number):
                return MISSING
            raise ValueError(f"sensor {name}={_show(value)} is not a finite number")
        if not -FLOAT32_MAX <= number <= FLOAT32_MAX:
            raise ValueError(_beyond_float32(name, value))
        return number

    def _event(self, t: float, machine: str, text: str) -> Event:
        if not EVENT_PATTERN.match(text):
            raise ValueError(f"event={_show(text)} is not failure[:KIND], maintenance:PART, error:CODE or anomaly")
        try:
            return validate(Event, {"timestamp": datetime.fromtimestamp(t, UTC), "machine_id": machine, "event": text})
        except ContractError as err:
            raise ValueError(str(err)) from None
