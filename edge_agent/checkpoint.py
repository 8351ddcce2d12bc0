"""What a restart needs besides the outbox: the open windows and where each source stopped.

Both are written in the outbox's transaction (see :meth:`edge_agent.outbox.Outbox.commit`), so after a crash the
agent resumes from a consistent cut: every reading before a source's saved position is either in an open window
(restored from here) or already in a committed prediction, and nothing after it has left a trace.

The open windows are kept as a *snapshot* of every reading the window builder holds, plus one *delta* per commit
(the readings it accepted since): columns packed into one blob, so a commit of 2,000 readings writes one row, not
2,000. Every ``snapshot_every`` seconds a fresh snapshot replaces the old one and its deltas; readings no future
window needs are gone from it, which bounds the journal. Each machine's last boundary (its *mark*) is a row of its
own, and so is each event; events older than the lookback go, except each machine's latest maintenance of each part.

The journal also counts the readings the window builder accepted, in the same transaction (``readings_accepted`` in
the ``meta`` table): a reading read again after a crash is a repeat the builder refuses, so the count is exact, and
with the quarantine's counts it accounts for every reading a source handed on (:func:`readings_accepted`).
"""

from __future__ import annotations

import sqlite3
import struct
from array import array
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from itertools import chain
from operator import itemgetter

from edge_agent.config import WindowSpec
from edge_agent.parsing import Reading
from precursor.contracts.messages import Event

_machine, _time, _sensors, _values = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)  # of a Reading
_MAGIC = b"PCJ1"
_HEADER = struct.Struct("<4sII")  # magic, rows, bytes of machine ids
_ACCEPTED = "readings_accepted"


class ReadingColumns:
    """Readings as columns: machine ids, times, sensor-layout ids and the values of every row, back to back.

    >>> columns = ReadingColumns()
    >>> columns.add(Reading("m1", 60.0, ("a", "b"), (1.0, float("nan"))), 1)
    >>> columns.add(Reading("m2", 61.0, ("a",), (3.0,)), 2)
    >>> [(m, t, layout, v) for m, t, layout, v in ReadingColumns.unpack(columns.pack(), {1: 2, 2: 1})]
    [('m1', 60.0, 1, (1.0, nan)), ('m2', 61.0, 2, (3.0,))]
    """

    def __init__(self) -> None:
        self.machines: list[str] = []
        self.times = array("d")
        self.layouts = array("i")
        self.values = array("d")

    def __len__(self) -> int:
        return len(self.machines)

    def add(self, reading: Reading, layout: int) -> None:
        self.machines.append(reading.machine_id)
        self.times.append(reading.t)
        self.layouts.append(layout)
        self.values.extend(reading.values)

    def pack(self) -> bytes:
        ids = "\n".join(self.machines).encode()
        header = _HEADER.pack(_MAGIC, len(self.machines), len(ids))
        return b"".join((header, ids, self.times.tobytes(), self.layouts.tobytes(), self.values.tobytes()))

    @staticmethod
    def unpack(blob: bytes, widths: Mapping[int, int]) -> Iterable[tuple[str, float, int, tuple[float, ...]]]:
        """(machine_id, t, layout id, values) per row; ``widths`` is each layout's number of sensors."""
        magic, rows, id_bytes = _HEADER.unpack_from(blob)
        if magic != _MAGIC:
            raise ValueError("not a window journal blob")
        at = _HEADER.size
        machines = blob[at : at + id_bytes].decode().split("\n") if rows else []
        at += id_bytes
        times = array("d", blob[at : at + 8 * rows])
        at += 8 * rows
        layouts = array("i", blob[at : at + 4 * rows])
        at += 4 * rows
        values = array("d", blob[at:])
        start = 0
        for machine, t, layout in zip(machines, times, layouts, strict=True):
            end = start + widths[layout]
            yield machine, t, layout, tuple(values[start:end])
            start = end


class WindowCheckpoint:
    """A :class:`~edge_agent.windows.WindowJournal` that buffers changes until the next commit writes them."""

    def __init__(self, db: sqlite3.Connection, spec: WindowSpec, *, snapshot_every_s: float = 10.0) -> None:
        self.db = db
        self._lookback = int(spec.event_lookback.total_seconds())
        self.snapshot_every_s = snapshot_every_s
        self._layouts: dict[tuple[str, ...], int] = {}
        self._last_layout: tuple[tuple[str, ...], int] | None = None
        # Accepted readings wait here as they are until the commit packs them: one list append per reading on the
        # hot path, and the packing done in bulk (see _pack).
        self._accepted: list[Reading] = []
        self._marks: dict[str, int] = {}
        self._events: list[tuple[str, float, str]] = []
        self._new_layouts: list[tuple[int, str]] = []
        for layout_id, sensors in db.execute("SELECT id, sensors FROM window_layouts"):
            self._layouts[tuple(sensors.split(",")) if sensors else ()] = layout_id
        self.accepted_total = readings_accepted(db)
        """Readings the window builder accepted, over every run, as of the last commit."""

    # --- the journal the window builder talks to ----------------------------------------------------------------

    def _layout(self, sensors: tuple[str, ...]) -> int:
        last = self._last_layout
        if last is not None and last[0] is sensors:  # readings of one source share one sensors tuple
            return last[1]
        layout = self._layouts.get(sensors)
        if layout is None:
            layout = self._layouts[sensors] = len(self._layouts) + 1
            self._new_layouts.append((layout, ",".join(sensors)))
        self._last_layout = (sensors, layout)
        return layout

    def accepted(self, reading: Reading) -> None:
        self._accepted.append(reading)

    def accepted_many(self, readings: list[Reading]) -> None:
        self._accepted += readings

    def _pack(self, rows: list[Reading]) -> bytes:
        """Readings as one journal blob (what ``ReadingColumns.add`` per reading would give, column by column).

        No Python-level step per reading: a source's readings share a handful of sensor tuples, so each distinct
        tuple object (by identity, in order of first use, as ids are handed out) is looked up once."""
        sensors = list(map(_sensors, rows))
        by_object = dict(zip(map(id, sensors), sensors, strict=True))
        layout_of = {key: self._layout(names) for key, names in by_object.items()}
        columns = ReadingColumns()
        columns.machines = list(map(_machine, rows))
        # From lists, not iterators: an array grows an item at a time from an iterator, at a third more cost.
        columns.times = array("d", list(map(_time, rows)))
        columns.layouts = array("i", list(map(layout_of.__getitem__, map(id, sensors))))
        columns.values = array("d", list(chain.from_iterable(map(_values, rows))))
        return columns.pack()

    def emitted(self, machine_id: str, boundary: int) -> None:
        self._marks[machine_id] = boundary

    def event(self, event: Event) -> None:
        self._events.append((event.machine_id, event.timestamp.timestamp(), event.event))

    # --- commit -------------------------------------------------------------------------------------------------

    def write(self, db: sqlite3.Connection) -> None:
        """Write what changed since the last commit (inside the caller's transaction)."""
        if self._accepted:
            blob = self._pack(self._accepted)  # first: it may find new layouts
            self._write_layouts(db)
            db.execute("INSERT INTO window_deltas (readings) VALUES (?)", (blob,))
            self._write_count(db)
        self._write_marks_and_events(db)

    def _write_count(self, db: sqlite3.Connection) -> None:
        db.execute(
            "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (_ACCEPTED, self.accepted_total + len(self._accepted)),
        )

    def write_snapshot(self, db: sqlite3.Connection, held: Iterable[Reading]) -> None:
        """Replace the journal by the readings the builder holds now (inside the caller's transaction)."""
        # Packed column by column, as the deltas are: a minute of a thousand machines' readings is 60,000 of them,
        # and a reading at a time would hold up the readings waiting for this commit by 0.1 s.
        blob = self._pack(list(held))
        self._write_layouts(db)
        db.execute("DELETE FROM window_deltas")
        db.execute("DELETE FROM window_snapshot")
        db.execute("INSERT INTO window_snapshot (id, readings) VALUES (1, ?)", (blob,))
        self._write_count(db)
        self._write_marks_and_events(db)
        db.execute(
            "DELETE FROM window_events WHERE t < (SELECT m.emitted_until - ? FROM window_marks m "
            "WHERE m.machine_id = window_events.machine_id) "
            "AND NOT (event LIKE 'maintenance:%' AND t = (SELECT MAX(e.t) FROM window_events e "
            "WHERE e.machine_id = window_events.machine_id AND e.event = window_events.event))",
            (self._lookback,),
        )

    def _write_layouts(self, db: sqlite3.Connection) -> None:
        if self._new_layouts:
            db.executemany("INSERT OR REPLACE INTO window_layouts (id, sensors) VALUES (?, ?)", self._new_layouts)

    def _write_marks_and_events(self, db: sqlite3.Connection) -> None:
        if self._marks:
            db.executemany(
                "INSERT INTO window_marks (machine_id, emitted_until) VALUES (?, ?) "
                "ON CONFLICT (machine_id) DO UPDATE SET emitted_until = excluded.emitted_until",
                self._marks.items(),
            )
        if self._events:
            db.executemany("INSERT INTO window_events (machine_id, t, event) VALUES (?, ?, ?)", self._events)

    def committed(self) -> None:
        """The last write is durable: start collecting the next changes."""
        self.accepted_total += len(self._accepted)
        self._accepted = []
        self._marks = {}
        self._events = []
        self._new_layouts = []

    def rolled_back(self) -> None:
        """The last commit failed: keep the changes for the next one (they are written again)."""

    # --- restart ------------------------------------------------------------------------------------------------

    def load(self) -> tuple[dict[str, int], list[Reading], list[Event]]:
        """(emitted boundary per machine, readings of the open windows, context events) as last committed.

        Readings an open window no longer needs may come back too; the window builder drops them.
        """
        marks = dict(self.db.execute("SELECT machine_id, emitted_until FROM window_marks").fetchall())
        sensors_of = {layout_id: sensors for sensors, layout_id in self._layouts.items()}
        widths = {layout_id: len(sensors) for layout_id, sensors in sensors_of.items()}
        blobs = [row[0] for row in self.db.execute("SELECT readings FROM window_snapshot")]
        blobs += [row[0] for row in self.db.execute("SELECT readings FROM window_deltas ORDER BY id")]
        readings = [
            Reading(machine, t, sensors_of[layout], values)
            for blob in blobs
            for machine, t, layout, values in ReadingColumns.unpack(blob, widths)
        ]
        events = [
            Event(timestamp=datetime.fromtimestamp(t, UTC), machine_id=machine_id, event=event)
            for machine_id, t, event in self.db.execute("SELECT machine_id, t, event FROM window_events ORDER BY t")
        ]
        return marks, readings, events


def readings_accepted(db: sqlite3.Connection) -> int:
    """How many readings the window builder accepted, over every run, as last committed."""
    row = db.execute("SELECT value FROM meta WHERE name = ?", (_ACCEPTED,)).fetchone()
    return 0 if row is None else int(row[0])


def read_positions(db: sqlite3.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT source, position FROM positions").fetchall())


def position_writer(positions: Mapping[str, str]) -> Callable[[sqlite3.Connection], None]:
    """A writer for :meth:`Outbox.commit` that saves each source's position."""

    def write(db: sqlite3.Connection) -> None:
        db.executemany(
            "INSERT INTO positions (source, position) VALUES (?, ?) "
            "ON CONFLICT (source) DO UPDATE SET position = excluded.position",
            list(positions.items()),
        )

    return write
