"""Sequence numbers that survive restarts.

Consumers drop a message whose ``(edge_id, seq)`` they have already stored, so an edge must never reuse a number.
The counter reserves numbers in blocks and writes the end of the current block to disk *before* using any number in
it: after a crash the agent resumes from the reserved end, skipping at most one block, never repeating.
"""

from __future__ import annotations

import os
from pathlib import Path


class SequenceCounter:
    """
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "seq"
    >>> c = SequenceCounter(path, block=10)
    >>> [c.next() for _ in range(3)]
    [0, 1, 2]
    >>> SequenceCounter(path, block=10).next()  # a restart resumes past the reserved block
    10
    """

    def __init__(self, path: str | Path, block: int = 1000) -> None:
        self.path = Path(path)
        self.block = block
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._next = int(self.path.read_text()) if self.path.exists() else 0
        self._reserved = self._next

    def next(self) -> int:
        if self._next >= self._reserved:
            self._reserve(self._next + self.block)
        value = self._next
        self._next += 1
        return value

    def _reserve(self, until: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            fh.write(str(until))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._reserved = until
