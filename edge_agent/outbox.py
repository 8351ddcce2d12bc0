"""The durable outbox: every prediction, event, heartbeat and telemetry summary is committed to local SQLite before
it is sent, and deleted only once Kafka acknowledged it (``acks=all``).

- Sequence numbers are assigned here, from a counter committed in the same transaction as the messages: a message
  keeps its ``(edge_id, seq)`` through any number of resends and restarts, so consumers drop the duplicates a resend
  makes. A number taken but never committed (the agent died first) is reused; it never left the machine.
- While the broker is unreachable the agent keeps predicting and the outbox grows up to ``max_bytes`` of queued
  messages. Past that, the oldest messages are dropped, lowest value first: telemetry summaries (sensor lines for
  the dashboard), heartbeats (only the latest matters), then predictions (an old risk estimate is the least
  actionable thing here), then events (failures and maintenance are the labels retraining needs). Every drop is
  counted per kind, and the counts survive restarts.

>>> import tempfile, pathlib
>>> from precursor.contracts.messages import Heartbeat
>>> box = Outbox(pathlib.Path(tempfile.mkdtemp()) / "state.db", max_bytes=10**6)
>>> hb = Heartbeat(edge_id="e1", seq=box.next_seq(), timestamp="2026-01-01T00:00:00Z",
...                model_name="m", model_version="1")
>>> box.stage(hb); box.commit()
1
>>> box.depth, [(row.seq, row.kind) for row in box.reader().pending(10)]
(1, [(0, 'heartbeat')])
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.statedb import Durability, open_state_db
from precursor.contracts.messages import EdgeEvent, Heartbeat, Prediction, TelemetrySummary, encode

log = logging.getLogger("precursor.edge.outbox")

DROP_ORDER = ("telemetry", "heartbeat", "prediction", "event")
"""What goes first when the outbox is full, oldest first within a kind."""
ROW_OVERHEAD = 64
"""Bytes counted per message beside its value: key, kind, sequence number and page overhead, roughly."""
_NEXT_SEQ = "next_seq"
_CHUNK = 500

OutboxMessage = Prediction | EdgeEvent | Heartbeat | TelemetrySummary


def message_kind(message: OutboxMessage) -> tuple[str, str]:
    """(kind, Kafka key): predictions, events and telemetry summaries keyed by machine, heartbeats by edge."""
    if isinstance(message, Prediction):
        return "prediction", message.machine_id
    if isinstance(message, EdgeEvent):
        return "event", message.machine_id
    if isinstance(message, Heartbeat):
        return "heartbeat", message.edge_id
    if isinstance(message, TelemetrySummary):
        return "telemetry", message.machine_id
    raise TypeError(f"the edge does not send {type(message).__name__} messages")


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    kind: str
    key: str
    value: bytes
    created_at: float


class Outbox:
    """The writer side, used by the agent's thread; :meth:`reader` gives the sender thread its own connection."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int,
        durability: Durability = "process",
        first_seq: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.durability = durability
        self._clock = clock
        self.db = open_state_db(self.path, durability)
        self._lock = threading.Lock()
        self._staged: list[tuple[int, str, str, bytes, float]] = []
        meta = dict(self.db.execute("SELECT name, value FROM meta").fetchall())
        self._next_seq = max(int(meta.get(_NEXT_SEQ, 0)), first_seq)
        self.dropped = {kind: int(meta.get(f"dropped_{kind}", 0)) for kind in DROP_ORDER}
        count, size = self.db.execute("SELECT COUNT(*), COALESCE(SUM(length(value)), 0) FROM messages").fetchone()
        self._depth = int(count)
        self._bytes = int(size) + ROW_OVERHEAD * int(count)
        self.committed = 0
        self._wake = threading.Event()

    # --- sequence and staging -----------------------------------------------------------------------------------

    def next_seq(self) -> int:
        value = self._next_seq
        self._next_seq += 1
        return value

    def stage(self, message: OutboxMessage) -> None:
        """Queue a message for the next :meth:`commit`; nothing is durable (or sent) before that."""
        kind, key = message_kind(message)
        self._staged.append((message.seq, kind, key, encode(message), self._clock()))

    # The Sink interface, so the agent can write here as it would to a publisher.
    send = stage

    def flush(self) -> None:
        self.commit()

    @property
    def staged(self) -> int:
        return len(self._staged)

    def commit(self, writers: Iterable[Callable[[sqlite3.Connection], None]] = ()) -> int:
        """Commit the staged messages, the sequence counter and whatever ``writers`` write, in one transaction.

        Returns how many messages were committed. Drops the oldest, least valuable messages if the bound is passed.
        """
        staged, self._staged = self._staged, []
        db = self.db
        added = sum(len(value) + ROW_OVERHEAD for _, _, _, value, _ in staged)
        db.execute("BEGIN IMMEDIATE")
        try:
            if staged:
                db.executemany(
                    "INSERT INTO messages (seq, kind, key, value, created_at) VALUES (?, ?, ?, ?, ?)", staged
                )
            db.execute(
                "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (_NEXT_SEQ, self._next_seq),
            )
            for write in writers:
                write(db)
            with self._lock:
                over = self._bytes + added - self.max_bytes
            dropped = self._drop(over) if over > 0 else {}
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._staged = staged + self._staged
            raise
        with self._lock:
            self._depth += len(staged) - sum(n for n, _ in dropped.values())
            self._bytes += added - sum(b for _, b in dropped.values())
        for kind, (n, _) in dropped.items():
            self.dropped[kind] += n
            log.warning(
                "outbox full: dropped %d oldest %s message(s)",
                n,
                kind,
                extra={"kind": kind, "dropped": n, "dropped_total": self.dropped[kind], "max_bytes": self.max_bytes},
            )
        self.committed += len(staged)
        if staged:
            self._wake.set()
        return len(staged)

    def _drop(self, over: int) -> dict[str, tuple[int, int]]:
        """Delete the oldest messages, lowest value first, until ``over`` bytes are freed: kind -> (count, bytes)."""
        dropped: dict[str, tuple[int, int]] = {}
        for kind in DROP_ORDER:
            while over > 0:
                rows = self.db.execute(
                    "SELECT seq, length(value) FROM messages WHERE kind = ? ORDER BY seq LIMIT ?", (kind, _CHUNK)
                ).fetchall()
                if not rows:
                    break
                take = []
                for seq, size in rows:
                    take.append(seq)
                    over -= size + ROW_OVERHEAD
                    if over <= 0:
                        break
                freed = _delete(self.db, take)
                count, size = dropped.get(kind, (0, 0))
                dropped[kind] = (count + len(freed), size + sum(freed) + ROW_OVERHEAD * len(freed))
        for kind, (count, _) in dropped.items():
            self.db.execute(
                "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + ?",
                (f"dropped_{kind}", count, count),
            )
        return dropped

    # --- what the sender and the operator see -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages committed and not yet acknowledged by Kafka."""
        return self._depth

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def reader(self) -> OutboxReader:
        return OutboxReader(self)

    def wake_sender(self) -> None:
        """End a :meth:`wait_for_messages` early (new messages, or the sender is stopping)."""
        self._wake.set()

    def wait_for_messages(self, timeout: float) -> None:
        """Block the sender until something was committed, or ``timeout`` passed."""
        self._wake.wait(timeout)
        self._wake.clear()

    def _forget(self, count: int, size: int) -> None:
        with self._lock:
            self._depth -= count
            self._bytes -= size

    def close(self) -> None:
        if self._staged:
            self.commit()
        self.db.close()


class OutboxReader:
    """The sender thread's view: the oldest messages, and deleting the ones Kafka acknowledged."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self.db = open_state_db(outbox.path, outbox.durability)

    def pending(self, limit: int) -> list[OutboxRow]:
        rows = self.db.execute(
            "SELECT seq, kind, key, value, created_at FROM messages ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [OutboxRow(*row) for row in rows]

    def oldest_created_at(self) -> float | None:
        row = self.db.execute("SELECT created_at FROM messages ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else float(row[0])

    def acknowledge(self, seqs: Sequence[int]) -> int:
        """Delete messages Kafka acknowledged; returns how many were still there (the bound may have dropped some)."""
        if not seqs:
            return 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            freed = _delete(self.db, seqs)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self._outbox._forget(len(freed), sum(freed) + ROW_OVERHEAD * len(freed))
        return len(freed)

    def close(self) -> None:
        self.db.close()


def _delete(db: sqlite3.Connection, seqs: Sequence[int]) -> list[int]:
    """Delete by sequence number; the sizes of the values of the rows that were there."""
    freed: list[int] = []
    for start in range(0, len(seqs), _CHUNK):
        chunk = list(seqs[start : start + _CHUNK])
        marks = ",".join("?" * len(chunk))
        freed += [
            size
            for (size,) in db.execute(f"DELETE FROM messages WHERE seq IN ({marks}) RETURNING length(value)", chunk)
        ]
    return freed
