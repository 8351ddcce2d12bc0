"""The agent's local state: one SQLite database in WAL mode, so the sender thread reads while the agent writes.

It holds the outbox (messages not yet acknowledged by Kafka), the sequence counter, the sources' positions and the
open windows. They live in one file so that one transaction moves them together: a reading's window, the prediction
it led to and the source position after it are committed at once, or not at all.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

Durability = Literal["process", "power"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_kind ON messages (kind, seq);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS positions (source TEXT PRIMARY KEY, position TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS window_layouts (id INTEGER PRIMARY KEY, sensors TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS window_snapshot (id INTEGER PRIMARY KEY, readings BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS window_deltas (id INTEGER PRIMARY KEY, readings BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS window_marks (machine_id TEXT PRIMARY KEY, emitted_until INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS window_events (machine_id TEXT NOT NULL, t REAL NOT NULL, event TEXT NOT NULL);
"""


def open_state_db(path: str | Path, durability: Durability = "process") -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit ``BEGIN IMMEDIATE``), with the schema in place.

    ``process``: a commit survives the agent being killed (``synchronous=NORMAL``: WAL pages reach the OS at commit).
    ``power``: it also survives a power cut (``synchronous=FULL``: an fsync per commit).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'FULL' if durability == 'power' else 'NORMAL'}")
    db.execute("PRAGMA busy_timeout=30000")
    db.executescript(SCHEMA)
    return db
