"""Following a growing CSV or JSONL file, the way ``tail -F`` does, without losing or repeating a line.

- Only complete lines (ending in a newline) are read; a half-written last line waits for its end.
- The position is the file's inode and the byte offset after the last line handed over. The agent saves it in the
  same transaction as everything those lines led to, so after a crash the tail resumes exactly there.
- Rotation by rename (``logrotate``'s default): once the path names a new file, the old one (still open) is read
  to its end first, a final line without a newline included, then the new file from its start.
  If the agent was down during a rotation, the file it was reading is looked up by inode in the same folder (where
  ``telemetry.csv.1`` usually is) and finished first.
- Rotation by truncation (``copytruncate``): a file shorter than the offset, or whose bytes just before the offset
  changed (it was truncated and refilled past the offset between two looks), is read again from its start.
- A CSV file's first line is its header; every rotated file starts with its own.
- ``RowError.line`` is the byte offset of the line in the file, as line numbers are unknown after a resume.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, BinaryIO

from edge_agent.config import InputSpec, TailSource, source_name
from edge_agent.parsing import CsvLayout, Record, RecordParser
from edge_agent.telemetry_source import Item, SourceBatch
from precursor.contracts.formats import RowError, read_machines

log = logging.getLogger("precursor.edge.tail")

_CHUNK = 1 << 16


def file_format(path: Path, declared: str | None) -> str:
    if declared:
        return declared
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise ValueError(f"tail source {path}: cannot tell the format from the suffix {suffix!r}; set format: csv or jsonl")


_MARK = 64
"""Bytes before the offset remembered, to notice a file that was truncated and refilled past the offset."""


@dataclass
class _Open:
    handle: BinaryIO
    inode: int
    offset: int
    layout: CsvLayout | None = None
    mark: bytes = b""  # the file's last bytes before ``offset``, as read
    mtime_ns: int = 0
    # Inside a line refused as too long whose end was not written yet: the rest of it is skipped when it comes, not
    # read as a line of its own (which counted one bad record twice).
    skipping: bool = False

    def rewritten(self, stat: os.stat_result) -> bool:
        """The file changed without growing past what was read: truncated (and maybe refilled)."""
        if stat.st_size < self.offset:
            return True
        if stat.st_mtime_ns == self.mtime_ns or not self.mark:
            return False
        self.mtime_ns = stat.st_mtime_ns
        return os.pread(self.handle.fileno(), len(self.mark), self.offset - len(self.mark)) != self.mark


class FileTail:
    def __init__(self, spec: TailSource, limits: InputSpec | None = None) -> None:
        self.spec = spec
        self.name = source_name(spec)
        self.path = Path(spec.path)
        self.format = file_format(self.path, spec.format)
        limits = limits or InputSpec()
        self.parser = RecordParser(str(self.path), max_sensors=limits.max_sensors)
        self.max_line = limits.max_record_bytes
        self._too_long = f"line longer than max_record_bytes={self.max_line} bytes"
        self.lines = 0
        self.rotations = 0

    def attributes(self) -> dict[str, dict[str, str]]:
        return read_machines(self.spec.machines) if self.spec.machines else {}

    def acknowledge(self, ack: Any) -> None:
        """The offset is in the outbox's database: nothing to tell anyone."""

    def close(self) -> None:
        pass

    # --- opening ------------------------------------------------------------------------------------------------

    def _idle(self) -> SourceBatch:
        """Nothing new: lets the agent commit and send heartbeats while the file is quiet."""
        return SourceBatch(self.name, [])

    def _open_at(self, path: Path, offset: int) -> _Open:
        handle = path.open("rb")
        inode = os.fstat(handle.fileno()).st_ino
        opened = _Open(handle, inode, 0)
        if offset > 0:
            if self.format == "csv":
                opened.layout = self._layout(handle.readline())
            handle.seek(max(0, offset - _MARK))
            opened.mark = handle.read(min(offset, _MARK))
            opened.offset = offset
        opened.mtime_ns = os.fstat(handle.fileno()).st_mtime_ns
        return opened

    def _rotated_away(self, inode: int) -> Path | None:
        """The file with ``inode`` in the tailed file's folder: where a rotation moved it while the agent was down."""
        try:
            for entry in os.scandir(self.path.parent):
                if entry.is_file(follow_symlinks=False) and entry.inode() == inode:
                    return Path(entry.path)
        except OSError:
            return None
        return None

    def _layout(self, header: bytes) -> CsvLayout:
        return self.parser.csv_header(header.decode("utf-8", errors="replace").rstrip("\r\n"))

    # --- reading ------------------------------------------------------------------------------------------------

    def batches(self, position: str | None, stop: threading.Event) -> Iterator[SourceBatch]:
        warned = False
        while not self.path.exists():
            if not warned:
                log.info("waiting for %s to appear", self.path, extra={"source": self.name})
                warned = True
            yield self._idle()
            if stop.wait(self.spec.poll.total_seconds()):
                return
        saved = json.loads(position) if position else None
        current = self.path.stat()
        if saved is not None and saved["inode"] != current.st_ino:
            old = self._rotated_away(int(saved["inode"]))
            if old is not None:
                log.info("finishing %s, rotated while the agent was down", old, extra={"source": self.name})
                yield from self._read_to_end(self._open_at(old, int(saved["offset"])), stop, final=True)
            else:
                log.warning(
                    "the file the agent was reading (inode %s) is gone; lines it had after offset %s are lost",
                    saved["inode"],
                    saved["offset"],
                    extra={"source": self.name},
                )
            saved = None
        if saved is not None:
            offset = int(saved["offset"]) if current.st_size >= int(saved["offset"]) else 0
        else:
            offset = current.st_size if (position is None and self.spec.start == "end") else 0
        opened = self._open_at(self.path, offset)
        if offset and self.format == "csv" and opened.layout is None:
            opened.layout = self._layout(opened.handle.readline())
        while not stop.is_set():
            yield from self._read_to_end(opened, stop, final=False)
            if stop.is_set():
                break
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                yield self._idle()
                stop.wait(self.spec.poll.total_seconds())  # renamed, and the new file not there yet
                continue
            if now.st_ino != opened.inode:
                # Renamed: whatever the writer added to the old file before switching is read, then the new file.
                yield from self._read_to_end(opened, stop, final=True)
                opened.handle.close()
                self.rotations += 1
                log.info("%s was rotated; reading the new file", self.path, extra={"source": self.name})
                opened = self._open_at(self.path, 0)
            elif opened.rewritten(now):
                log.info("%s was truncated; reading it from the start", self.path, extra={"source": self.name})
                self.rotations += 1
                opened.handle.seek(0)
                opened.offset = 0
                opened.layout = None
                opened.mark = b""
            else:
                yield self._idle()
                stop.wait(self.spec.poll.total_seconds())
        opened.handle.close()

    def _read_to_end(self, opened: _Open, stop: threading.Event, *, final: bool) -> Iterator[SourceBatch]:
        """Batches of the complete lines from the current offset to the end of the file.

        ``final``: the file will not grow any more (rotated away), so a last line without a newline counts too.
        """
        handle = opened.handle
        handle.seek(opened.offset)
        if opened.skipping:
            skipped, ended = self._skip_line(handle)
            self._advance_past(opened, skipped)
            if not ended:
                return
            opened.skipping = False
        pending = b""
        items: list[Item] = []
        started = time.monotonic()
        while not stop.is_set():
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            if not items:
                started = time.monotonic()
            pending += chunk
            lines = pending.split(b"\n")
            if len(lines) > 1:
                opened.mark = (opened.mark + pending[: len(pending) - len(lines[-1])])[-_MARK:]
            pending = lines.pop()
            block = self._csv_block(opened, lines)
            if block is not None:
                self.lines += len(lines)
                opened.offset += sum(map(len, lines)) + len(lines)
                items.extend(block)
            else:
                for raw in lines:
                    start = opened.offset
                    opened.offset += len(raw) + 1
                    items.extend(self._records(opened, raw, start))
            if len(pending) > self.max_line:
                # A line this long is garbage (or a binary file): quarantine its start and skip to its end.
                items.append(
                    RowError(
                        str(self.path),
                        opened.offset,
                        pending[:200].decode("utf-8", "replace"),
                        self._too_long,
                    )
                )
                skipped, ended = self._skip_line(handle)
                self._advance_past(opened, len(pending) + skipped)
                opened.skipping = not ended
                pending = b""
            if len(items) >= self.spec.batch_rows:
                yield SourceBatch(self.name, items, self._position(opened), arrived=started)
                items = []
        if final and pending:
            start = opened.offset
            opened.offset += len(pending)
            opened.mark = (opened.mark + pending)[-_MARK:]
            items.extend(self._records(opened, pending, start))
        if items:
            yield SourceBatch(self.name, items, self._position(opened), arrived=started)

    def _skip_line(self, handle: BinaryIO) -> tuple[int, bool]:
        """Read past the end of the current line: the bytes skipped (its newline included), and whether its end was
        there (False: the file ends inside the line for now)."""
        skipped = 0
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                return skipped, False
            end = chunk.find(b"\n")
            if end >= 0:
                handle.seek(end + 1 - len(chunk), os.SEEK_CUR)
                return skipped + end + 1, True
            skipped += len(chunk)

    @staticmethod
    def _advance_past(opened: _Open, skipped: int) -> None:
        opened.offset += skipped
        opened.mark = os.pread(
            opened.handle.fileno(), min(_MARK, opened.offset), opened.offset - min(_MARK, opened.offset)
        )

    def _position(self, opened: _Open) -> str:
        return json.dumps({"inode": opened.inode, "offset": opened.offset})

    def _csv_block(self, opened: _Open, lines: list[bytes]) -> list[Record] | None:
        """The readings of complete CSV lines after the header, parsed together when every line is a usual row (see
        :meth:`RecordParser.csv_block`); None sends them through :meth:`_records` one by one, which says what is wrong
        with a bad one and where."""
        if self.format != "csv" or opened.layout is None or not lines or max(map(len, lines)) > self.max_line:
            return None
        try:
            # Decodes where each line decodes: a newline byte cannot be part of a multi-byte character.
            text = b"\n".join(lines).decode("utf-8")
        except UnicodeDecodeError:
            return None
        rows = text.split("\n")
        if "\r" in text:
            rows = list(map(str.rstrip, rows, repeat("\r")))  # as _records does
        if "" in rows:  # a blank line is skipped, which _records does
            return None
        return self.parser.csv_block(opened.layout, rows)

    def _records(self, opened: _Open, raw: bytes, offset: int) -> list[Record]:
        self.lines += 1
        if len(raw) > self.max_line:  # refused whole, as the replay does (a longer one never gets this far)
            return [RowError(str(self.path), offset, raw[:200].decode("utf-8", "replace"), self._too_long)]
        try:
            text = raw.decode("utf-8-sig" if offset == 0 else "utf-8").rstrip("\r")  # a byte order mark is no data
        except UnicodeDecodeError as err:
            return [RowError(str(self.path), offset, raw[:200].decode("utf-8", "replace"), f"not valid UTF-8: {err}")]
        if not text.strip():
            return []
        if self.format == "jsonl":
            return self.parser.json_line(text, offset)
        if opened.layout is None:
            if offset == 0:
                opened.layout = self.parser.csv_header(text)
                return []
            opened.layout = self._layout(b"")
        return [self.parser.csv_text(opened.layout, text, offset)]
