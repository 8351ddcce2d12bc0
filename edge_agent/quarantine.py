"""Where bad input goes: a local JSONL file with the raw record and the reason, plus a counter per reason kind."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path


class Quarantine:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def put(self, source: str, raw: str, reason: str) -> None:
        self.counts[source] += 1
        record = {"at": datetime.now(UTC).isoformat(), "source": source, "reason": reason, "raw": raw[:4096]}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
