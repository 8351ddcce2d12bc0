"""Where telemetry comes from: file replay and the simulator here, and :func:`open_source`, which picks the source a
config names (file tail in :mod:`edge_agent.tail`, MQTT in :mod:`edge_agent.mqtt`).

Every source speaks :class:`~edge_agent.telemetry_source.TelemetrySource`; that interface lives in its own module so
the tail and MQTT sources implement it without importing this factory (which imports them).
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from edge_agent.config import (
    InputSpec,
    MqttSource,
    ReplaySource,
    SimulatorSource,
    Source,
    TailSource,
    source_name,
)
from edge_agent.parsing import CsvLayout, Reading, Record, RecordParser
from edge_agent.telemetry_source import Item, SourceBatch, TelemetrySource
from precursor.contracts.formats import RowError, read_machines
from precursor.contracts.messages import Event, TelemetryReading

Mark = Any
"""A source's own token for its position just after an item (a count, an instant): cheap to keep per item."""


def record_chunks(
    path: Path, parser: RecordParser, lines: int = 256, *, max_line: int | None = None
) -> Iterator[list[Record]]:
    """The records of a CSV, JSONL or Parquet file, in file order, about ``lines`` at a time.

    Never raises for what one record holds: a row that cannot be read (bad UTF-8, a line longer than ``max_line``,
    default the parser's ``max_record_bytes``, held in memory only up to that) is a :class:`RowError`. A file that
    cannot be opened or read at all still raises.
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_chunks(path, parser, lines)
        return
    cap = max_line or parser.max_record_bytes
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        if fh.read(1) != "\ufeff":  # a byte order mark is no data (utf-8-sig would skip it, at half the speed)
            fh.seek(0)
        read = functools.partial(fh.readline, cap + 1)
        line = 1
        if suffix not in (".jsonl", ".ndjson", ".json"):
            while True:  # the header is the first line that is not blank
                header, bad = _read_lines(fh, read, 1, cap, parser.source, line)
                line += 1
                if not header:
                    return
                if bad:
                    layout = CsvLayout((), -1, -1, None, (), (), error=f"bad CSV header: {bad[0].reason}")
                    break
                if header[0].strip():
                    layout = parser.csv_header(header[0].rstrip("\r\n"))
                    break
        while True:
            texts, bad = _read_lines(fh, read, lines, cap, parser.source, line)
            if not texts:
                return
            chunk: list[Record] = []
            start = 0
            for i in [*sorted(bad), len(texts)]:
                if suffix in (".jsonl", ".ndjson", ".json"):
                    for n, text in enumerate(texts[start:i], start=line + start):
                        if text.strip():
                            chunk.extend(parser.json_line(text, n))
                elif i > start:
                    chunk.extend(parser.csv_lines(layout, texts[start:i], line + start))
                if i in bad:
                    chunk.append(bad[i])
                start = i + 1
            line += len(texts)
            yield chunk


def _read_lines(
    fh: TextIO, read: Callable[[], str], count: int, cap: int, source: str, first: int
) -> tuple[list[str], dict[int, RowError]]:
    """Up to ``count`` lines, and the unreadable ones among them (by index) as errors: their text is left blank.

    ``read`` returns at most ``cap + 1`` characters, so a line longer than ``cap`` comes in pieces: they are joined
    back into one (refused) line here, and what is left of it after the pieces read is skipped, never held."""
    texts = list(itertools.islice(iter(read, ""), count))
    if not texts or (max(map(len, texts)) <= cap and "\ufffd" not in "".join(texts)):
        return texts, {}
    lines: list[str] = []
    bad: dict[int, RowError] = {}
    pieces = iter(texts)
    for text in pieces:
        n = len(lines)
        if len(text) > cap and not text.endswith("\n"):
            rest = text
            while rest and not rest.endswith("\n"):
                rest = next(pieces, None) or fh.readline(1 << 16)
            bad[n] = RowError(source, first + n, text[:200], f"line longer than max_record_bytes={cap} bytes")
            text = ""
        elif "\ufffd" in text:
            # The file is read with errors="replace": a replacement character marks bytes that were not UTF-8.
            bad[n] = RowError(source, first + n, text[:4096], "not valid UTF-8 (bytes replaced by U+FFFD)")
            text = ""
        lines.append(text)
    return lines, bad


def _parquet_chunks(path: Path, parser: RecordParser, lines: int) -> Iterator[list[Record]]:
    import pyarrow.parquet as pq  # only where Parquet is used: the edge install may not have pyarrow

    line = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=lines):
        try:
            rows: list[Any] = batch.to_pylist()
        except Exception:  # a value Python cannot hold (a timestamp past year 9999): row by row says which
            rows = [_parquet_row(batch, i) for i in range(batch.num_rows)]
        chunk: list[Record] = []
        for row in rows:
            line += 1
            if isinstance(row, Exception):
                chunk.append(RowError(parser.source, line, "", f"unreadable Parquet row: {type(row).__name__}: {row}"))
                continue
            record = parser.json_record(row, line, "", nan_is_missing=True)
            if isinstance(record, RowError):  # the raw text is only worth making for a bad row
                record = RowError(record.source, line, repr(row)[:4096], record.reason)
            chunk.append(record)
        yield chunk


def _parquet_row(batch: Any, i: int) -> dict[str, Any] | Exception:
    try:
        return batch.slice(i, 1).to_pylist()[0]  # type: ignore[no-any-return]
    except Exception as err:  # the row is quarantined with this
        return err


def read_records(path: Path, parser: RecordParser) -> Iterator[Record]:
    """Every record of a CSV, JSONL or Parquet file, in file order."""
    for chunk in record_chunks(path, parser):
        yield from chunk


class _Pace:
    """How long to wait so event time advances ``speedup`` times faster than wall time; 0 means no pacing."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self._origin: tuple[float, float] | None = None

    def delay(self, event_time: float) -> float:
        if self.speedup <= 0 or self.speedup == float("inf"):
            return 0.0
        if self._origin is None:
            self._origin = (event_time, time.monotonic())
            return 0.0
        return self._origin[1] + (event_time - self._origin[0]) / self.speedup - time.monotonic()


def _batched(
    name: str,
    items: Iterator[tuple[Item, Mark]],
    size: int,
    speedup: float,
    stop: threading.Event,
    encode: Callable[[Mark], str],
    max_ahead_s: float | None = None,
) -> Iterator[SourceBatch]:
    """Group items into batches; a paced source hands over what it has before it sleeps.

    Each item comes with its *mark*, the source's position just after it; a batch carries the mark of its last item,
    so the position counts exactly the items handed on. An item held back during a pacing wait (or when ``stop``
    comes) is not in it: a restart reads that item again rather than skipping it.

    A reading stamped more than ``max_ahead_s`` past the wall clock is not waited for (nor does it set the pace): the
    agent quarantines it as from the future, and waiting for its time would stall the replay for years.
    """
    pace = _Pace(speedup)
    batch: list[Item] = []
    mark: Mark = None
    started = time.monotonic()
    for item, item_mark in items:
        if stop.is_set():
            break
        if isinstance(item, Reading | TelemetryReading) and pace.speedup:
            t = item.t if isinstance(item, Reading) else item.timestamp.timestamp()
            wait = 0.0 if max_ahead_s is not None and t > time.time() + max_ahead_s else pace.delay(t)
            while wait > 0:
                if batch:
                    yield SourceBatch(name, batch, encode(mark), arrived=started)
                    batch = []
                else:
                    yield SourceBatch(name, [])  # nothing new yet: the agent may commit and send heartbeats
                if stop.wait(min(wait, 0.2)):
                    return
                wait = pace.delay(t)
        if not batch:
            started = time.monotonic()
        batch.append(item)
        mark = item_mark
        if len(batch) >= size:
            yield SourceBatch(name, batch, encode(mark), arrived=started)
            batch = []
    if batch:
        yield SourceBatch(name, batch, encode(mark), arrived=started)


class FileReplay:
    """Replays a telemetry file with its events file.

    Events are interleaved per machine: before a machine's reading at time t, every event of that machine up to t is
    yielded, so the windows see the same context they would have seen live, whatever order the file has across
    machines. Events after a machine's last reading (a failure after the telemetry ends, say) come at the end.
    The position is the number of items replayed, so a restart skips what was already committed.
    """

    def __init__(self, spec: ReplaySource, limits: InputSpec | None = None) -> None:
        self.spec = spec
        self.name = source_name(spec)
        self.limits = limits or InputSpec()

    def attributes(self) -> dict[str, dict[str, str]]:
        return read_machines(self.spec.machines) if self.spec.machines else {}

    def _parser(self, path: Path) -> RecordParser:
        return RecordParser(
            str(path), max_sensors=self.limits.max_sensors, max_record_bytes=self.limits.max_record_bytes
        )

    def _chunks(self) -> Iterator[list[Item]]:
        """The replay's items, a chunk (about ``batch_rows`` telemetry rows, with their events) at a time."""
        pending: dict[str, list[Event]] = defaultdict(list)
        if self.spec.events is not None:
            errors: list[Item] = []
            for record in read_records(self.spec.events, self._parser(self.spec.events)):
                if isinstance(record, Event):
                    pending[record.machine_id].append(record)
                elif isinstance(record, Reading):
                    errors.append(
                        RowError(str(self.spec.events), 0, repr(record)[:200], "an events file row without an event")
                    )
                else:
                    errors.append(record)
            if errors:
                yield errors
        for events in pending.values():
            events.sort(key=lambda e: e.timestamp, reverse=True)  # pop() from the end = oldest first
        telemetry = self._parser(self.spec.telemetry)
        for records in record_chunks(self.spec.telemetry, telemetry, self.spec.batch_rows):
            if not pending:
                yield records  # type: ignore[misc]
                continue
            chunk: list[Item] = []
            for record in records:
                if type(record) is Reading:
                    queue = pending.get(record.machine_id)
                    while queue and queue[-1].timestamp.timestamp() <= record.t:
                        chunk.append(queue.pop())
                chunk.append(record)
            yield chunk
        leftovers = sorted((e for q in pending.values() for e in q), key=lambda e: (e.timestamp, e.machine_id))
        if leftovers:
            yield leftovers  # type: ignore[misc]

    def __iter__(self) -> Iterator[Item]:
        for chunk in self._chunks():
            yield from chunk

    def batches(self, position: str | None, stop: threading.Event) -> Iterator[SourceBatch]:
        skip = int(json.loads(position)["items"]) if position else 0
        done = skip
        if self.spec.speedup > 0:  # paced: item by item, so each waits for its time
            counted = zip(itertools.islice(iter(self), skip, None), itertools.count(skip + 1))
            yield from _batched(
                self.name,
                counted,
                self.spec.batch_rows,
                self.spec.speedup,
                stop,
                lambda n: json.dumps({"items": n}),
                max_ahead_s=self.limits.max_future.total_seconds(),
            )
            return
        chunks = self._chunks()
        while not stop.is_set():
            started = time.monotonic()  # a row arrives when the replay reads it
            chunk = next(chunks, None)
            if chunk is None:
                return
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            done += len(chunk)
            yield SourceBatch(self.name, chunk, json.dumps({"items": done}), arrived=started)

    def acknowledge(self, ack: Any) -> None:
        """The position is in the outbox's database: nothing to tell anyone."""

    def close(self) -> None:
        pass


class SimulatedFleet:
    """The built-in simulator, streaming live at an accelerated clock. The position is the last simulated instant
    and how many items of that instant were taken, so a restart continues the same deterministic stream."""

    def __init__(self, spec: SimulatorSource) -> None:
        from precursor.simulator.config import FleetConfig

        self.spec = spec
        self.name = source_name(spec)
        self._config = FleetConfig(
            machines=spec.machines,
            duration=spec.duration,
            interval=spec.interval,
            seed=spec.seed,
            machine_prefix=spec.machine_prefix,
            **({"failure_kinds": tuple(spec.kinds)} if spec.kinds else {}),
        )

    def attributes(self) -> dict[str, dict[str, str]]:
        from precursor.simulator.fleet import machine_attributes

        return machine_attributes(self._config)

    def _items(self, position: str | None) -> Iterator[tuple[Item, tuple[int, int]]]:
        """Each item with the position just after it: its instant and how many items of that instant it makes."""
        from precursor.simulator.stream import stream_fleet

        start_at, skip = None, 0
        at: tuple[int, int] | None = None
        if position:
            saved = json.loads(position)
            start_at, skip = int(saved["t"]), int(saved["n"])
            at = (start_at, skip)
        try:
            stream = stream_fleet(self._config, speedup=0, start_at=None if start_at is None else float(start_at))
        except ValueError:
            return  # the saved instant is past the simulated span: the run had ended
        for item in stream:
            t = int(item.timestamp.timestamp())
            if start_at is not None and t == start_at and skip:
                skip -= 1
                continue
            at = (t, at[1] + 1 if at is not None and at[0] == t else 1)
            yield (Reading.from_contract(item) if isinstance(item, TelemetryReading) else item), at

    def batches(self, position: str | None, stop: threading.Event) -> Iterator[SourceBatch]:
        yield from _batched(
            self.name,
            self._items(position),
            self.spec.batch_rows,
            self.spec.speedup,
            stop,
            lambda at: json.dumps({"t": at[0], "n": at[1]}),
        )

    def __iter__(self) -> Iterator[Item]:
        return (item for item, _ in self._items(None))

    def acknowledge(self, ack: Any) -> None:
        pass

    def close(self) -> None:
        pass


def open_source(spec: Source, *, edge_id: str, limits: InputSpec | None = None) -> TelemetrySource:
    limits = limits or InputSpec()
    if isinstance(spec, ReplaySource):
        return FileReplay(spec, limits)
    if isinstance(spec, TailSource):
        from edge_agent.tail import FileTail

        return FileTail(spec, limits)
    if isinstance(spec, MqttSource):
        from edge_agent.mqtt import MqttSubscription

        return MqttSubscription(spec, edge_id=edge_id, limits=limits)
    return SimulatedFleet(spec)
