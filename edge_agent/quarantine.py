"""Where bad input goes: a local JSONL file with the raw record and the reason, plus a counter per kind of problem.

Nothing bad is dropped silently and nothing bad stops the agent: each record is one line of
``{"at", "source", "kind", "reason", "raw"}``. The file rotates to ``.1`` at ``max_bytes`` (one old file is kept),
so a flood of garbage cannot fill the disk.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

_KINDS = (
    ("not valid JSON", "malformed"),
    ("not valid UTF-8", "malformed"),
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
    """
    for marker, kind in _KINDS:
        if marker in reason:
            return kind
    return "invalid"


class Quarantine:
    def __init__(self, path: str | Path, *, max_bytes: int = 64 * 2**20) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.counts: Counter[str] = Counter()
        self._fh: TextIO | None = None
        self._size = self.path.stat().st_size if self.path.exists() else 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def put(self, source: str, raw: str, reason: str, kind: str | None = None) -> str:
        """Record one bad record; returns its kind."""
        kind = kind or reason_kind(reason)
        self.counts[kind] += 1
        record = {
            "at": datetime.now(UTC).isoformat(),
            "source": source,
            "kind": kind,
            "reason": reason,
            "raw": raw[:4096],
        }
        line = json.dumps(record) + "\n"
        if self._size + len(line) > self.max_bytes:
            self._rotate()
        if self._fh is None:
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write(line)
        self._fh.flush()
        self._size += len(line)
        return kind

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
