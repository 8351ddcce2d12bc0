"""Where bad input goes: a local JSONL file with the raw record and the reason, plus a counter per kind of problem.

Nothing bad is dropped silently and nothing bad stops the agent: each record is one line of
``{"at", "source", "kind", "reason", "raw"}``. The file rotates to ``.1`` at ``max_bytes`` (one old file is kept),
so a flood of garbage cannot fill the disk.

Exactly once, with the agent's outbox: an entry is written to the file inside the commit that also saves the
position past its record, and the file's size (with its inode) and the counts per kind are saved in that same
transaction (:meth:`Quarantine.write`). A commit that fails, or a process killed before its commit, leaves lines
past the saved size: :meth:`Quarantine.recover` cuts them off at the next start (the records are read again from
the saved position and quarantined again). The entries of a batch the agent is still handling are *held* until the
batch ends, as the batch's position is only committed then.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

_KINDS = (
    ("not valid JSON", "malformed"),
    ("not valid UTF-8", "malformed"),
    ("not a CSV line", "malformed"),
    ("unreadable", "malformed"),
    ("fields, the header has", "malformed"),
    ("expected a JSON object", "malformed"),
    ("bad CSV header", "malformed"),
    ("longer than max_record_bytes", "malformed"),
    ("over max_record_bytes", "malformed"),
    ("not a finite number", "non_finite"),
    ("is too large", "non_finite"),
    ("timestamp=", "bad_timestamp"),
    ("machine_id", "bad_identifier"),
    ("sensor name", "bad_identifier"),
    ("sensors, more than", "too_many_sensors"),
    ("event=", "bad_event"),
    ("not a number", "wrong_type"),
    ("boolean", "wrong_type"),
    ("is text", "wrong_type"),
    ("is a ", "wrong_type"),
)


def reason_kind(reason: str) -> str:
    """A short label for a quarantine reason, for counters and metrics.

    >>> reason_kind("sensor temp='NaN' is not a finite number"), reason_kind("not valid JSON: Expecting value")
    ('non_finite', 'malformed')
    >>> reason_kind("sensor temp=1e+308 is too large: beyond float32's range"), reason_kind("not a CSV line: ...")
    ('non_finite', 'malformed')
    """
    for marker, kind in _KINDS:
        if marker in reason:
            return kind
    return "invalid"


_META = "quarantine:"  # meta rows: quarantine:inode, quarantine:size, quarantine:kind:<kind>


class Quarantine:
    def __init__(self, path: str | Path, *, max_bytes: int = 64 * 2**20) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.counts: Counter[str] = Counter()
        """Entries per kind: those committed in earlier runs (after :meth:`recover`) and every one put since."""
        self.saved_counts: Counter[str] = Counter()
        """Entries per kind as of the last commit (with the outbox), or written (without)."""
        self._fh: TextIO | None = None
        self._size = self.path.stat().st_size if self.path.exists() else 0
        self._held: list[tuple[str, str]] = []  # (kind, line) of the batch being handled
        self._ready: list[tuple[str, str]] = []  # (kind, line) the next commit writes
        self._writing: list[tuple[str, str]] = []  # written to the file, their commit not yet done
        self._saved: tuple[int, int] | None = None  # (inode, size) of the file as of the last commit
        self._pending_save: tuple[int, int] | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def put(self, source: str, raw: str, reason: str, kind: str | None = None, *, held: bool = False) -> str:
        """Record one bad record; returns its kind. A ``held`` entry waits for :meth:`release`."""
        kind = kind or reason_kind(reason)
        self.counts[kind] += 1
        record = {
            "at": datetime.now(UTC).isoformat(),
            "source": source,
            "kind": kind,
            "reason": reason,
            "raw": raw[:4096],
        }
        (self._held if held else self._ready).append((kind, json.dumps(record) + "\n"))
        return kind

    def release(self) -> None:
        """The batch whose entries were held is handled: its entries go with the next commit."""
        self._ready += self._held
        self._held = []

    def flush(self) -> None:
        """Without an outbox: write what is ready (nothing to be consistent with)."""
        self._write_lines()
        self._done()

    def _write_lines(self) -> None:
        self._writing, self._ready = self._ready, []
        for _kind, line in self._writing:
            if self._size + len(line) > self.max_bytes:
                self._rotate()
            if self._fh is None:
                self._fh = self.path.open("a", encoding="utf-8")
            self._fh.write(line)
            self._size += len(line)
        if self._fh is not None:
            self._fh.flush()

    def _done(self) -> None:
        for kind, _line in self._writing:
            self.saved_counts[kind] += 1
        self._writing = []

    # --- with the outbox's commit -------------------------------------------------------------------------------

    def write(self, db: sqlite3.Connection) -> None:
        """Write the ready entries to the file and save its size and the counts (inside the caller's transaction)."""
        self._pending_save = None
        if not self._ready and self._saved is not None:
            return  # nothing new: most commits have no bad record
        self._write_lines()
        counts = self.saved_counts.copy()
        counts.update(kind for kind, _ in self._writing)
        inode = self.path.stat().st_ino if self.path.exists() else 0
        rows = [(f"{_META}inode", inode), (f"{_META}size", self._size)]
        rows += [(f"{_META}kind:{kind}", n) for kind, n in counts.items()]
        db.executemany(
            "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value", rows
        )
        self._pending_save = (inode, self._size)

    def committed(self) -> None:
        """The transaction :meth:`write` wrote into is durable."""
        self._done()
        self._saved = self._pending_save or self._saved

    def rolled_back(self) -> None:
        """The transaction failed: cut the file back and keep the entries for the next commit."""
        self._ready = self._writing + self._ready
        self._writing = []
        self.close()
        if self._saved is not None:
            self._cut_back(*self._saved)
        self._size = self.path.stat().st_size if self.path.exists() else 0

    def recover(self, db: sqlite3.Connection) -> None:
        """At start: cut off what a run wrote past its last commit, and take the committed counts."""
        saved = dict(db.execute("SELECT name, value FROM meta WHERE name LIKE ?", (f"{_META}%",)).fetchall())
        self.saved_counts = Counter(self.saved(db))
        self.counts = self.saved_counts.copy()
        if f"{_META}inode" in saved:
            self._saved = (int(saved[f"{_META}inode"]), int(saved[f"{_META}size"]))
            self._cut_back(*self._saved)
        self._size = self.path.stat().st_size if self.path.exists() else 0

    @staticmethod
    def saved(db: sqlite3.Connection) -> dict[str, int]:
        """The committed counts per kind (what :meth:`recover` takes), read from the state database."""
        rows = db.execute("SELECT name, value FROM meta WHERE name LIKE ?", (f"{_META}kind:%",)).fetchall()
        return {name.removeprefix(f"{_META}kind:"): int(value) for name, value in rows}

    def _cut_back(self, inode: int, size: int) -> None:
        """Make the file what it was at the commit that saved (inode, size); inode 0: there was no file then."""
        if inode == 0:
            if self.path.exists():
                self.path.unlink()
            return
        rotated = self.path.with_name(self.path.name + ".1")
        if rotated.exists() and rotated.stat().st_ino == inode and not self._is(inode):
            rotated.replace(self.path)  # rotated in the commit that did not happen: undo it
        if self._is(inode) and self.path.stat().st_size > size:
            with self.path.open("r+b") as fh:
                fh.truncate(size)

    def _is(self, inode: int) -> bool:
        return self.path.exists() and self.path.stat().st_ino == inode

    def _rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.path.exists():
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        self._size = 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
