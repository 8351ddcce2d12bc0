"""The prediction store: an embedded DuckDB file that the pipelines write and ``precursor query`` reads.

Rows are keyed by the edge's idempotency key ``(edge_id, seq)``, and every insert is ``ON CONFLICT DO NOTHING``: a
re-run over the same Kafka offsets, or a retried send from an edge, never adds a row twice.

Besides predictions and events, the pipelines keep here: ``alerts`` (raised and cleared, keyed by machine, kind,
time and state), ``alert_timelines`` (each machine's event-time alert state carried from one bounded run to the next),
``model_metrics`` (quality per model version, kind and monitoring window) and ``drift`` (PSI per feature and window;
rows with ``drifted`` are the drift events).

DuckDB lets one process write at a time, so writers hold the file only for the length of one batch and readers retry
briefly when a writer has it (see :func:`connect`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from precursor.store.errors import StoreBusy
from precursor.store.ledger import LEDGER_COLUMNS, LEDGER_INSERT, LEDGER_TABLE, Coverage, Spans, consumed
from precursor.store.location import StoreLocation, is_postgres, redact

HEARTBEATS_TABLE = """
-- trust: verified, unsigned or forged (pipelines.edge_trust). It is part of the key, so a forged heartbeat that
-- reuses an edge's (edge_id, seq) is kept beside the real one and never takes its place.
CREATE TABLE IF NOT EXISTS heartbeats (
    edge_id       VARCHAR NOT NULL,
    seq           BIGINT  NOT NULL,
    ts            TIMESTAMPTZ NOT NULL,
    model_name    VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    model_sha256  VARCHAR,
    outbox_depth  BIGINT  NOT NULL,
    lag_s         DOUBLE  NOT NULL,
    health        VARCHAR NOT NULL,
    machines      BIGINT  NOT NULL,
    ingested_at   TIMESTAMPTZ NOT NULL,
    trust         VARCHAR NOT NULL DEFAULT 'unsigned',
    trust_reason  VARCHAR,
    model_known   BOOLEAN,
    agent_version VARCHAR,
    agent_sha256  VARCHAR,
    key_id        VARCHAR,
    flow          JSON,
    PRIMARY KEY (edge_id, seq, trust)
);
-- What flowed through the edge (precursor.contracts.messages.EdgeFlow); a store from before it gains the column.
ALTER TABLE heartbeats ADD COLUMN IF NOT EXISTS flow JSON;
"""
HEARTBEATS_V1_COLUMNS = (
    "edge_id, seq, ts, model_name, model_version, model_sha256, outbox_depth, lag_s, health, machines, ingested_at"
)
HEARTBEATS_FROM_V1 = (
    "ALTER TABLE heartbeats RENAME TO heartbeats_v1;"
    + HEARTBEATS_TABLE
    + f"INSERT INTO heartbeats ({HEARTBEATS_V1_COLUMNS}) SELECT {HEARTBEATS_V1_COLUMNS} FROM heartbeats_v1;"
    + "DROP TABLE heartbeats_v1;"
)
"""A store from before heartbeats were judged: its rows carried no signature, so they become ``unsigned``."""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS predictions (
    edge_id        VARCHAR   NOT NULL,
    seq            BIGINT    NOT NULL,
    machine_id     VARCHAR   NOT NULL,
    window_start   TIMESTAMPTZ NOT NULL,
    window_end     TIMESTAMPTZ NOT NULL,
    horizon_h      DOUBLE    NOT NULL,
    risk           JSON      NOT NULL,
    max_risk       DOUBLE    NOT NULL,
    top_kind       VARCHAR   NOT NULL,
    model_name     VARCHAR   NOT NULL,
    model_version  VARCHAR   NOT NULL,
    emitted_at     TIMESTAMPTZ NOT NULL,
    ingested_at    TIMESTAMPTZ NOT NULL,
    threshold      DOUBLE,
    PRIMARY KEY (edge_id, seq)
);
-- Stores made before predictions carried their model's threshold gain the column (NULL: judged at the default).
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS threshold DOUBLE;
-- What moved the risk most, as the edge explained it (alerting windows only; NULL: not explained).
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS reasons JSON;
CREATE TABLE IF NOT EXISTS events (
    edge_id     VARCHAR NOT NULL,
    seq         BIGINT  NOT NULL,
    machine_id  VARCHAR NOT NULL,
    ts          TIMESTAMPTZ NOT NULL,
    event       VARCHAR NOT NULL,
    kind        VARCHAR NOT NULL,
    detail      VARCHAR,
    ingested_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (edge_id, seq)
);
CREATE TABLE IF NOT EXISTS alerts (
    machine_id    VARCHAR     NOT NULL,
    kind          VARCHAR     NOT NULL,
    state         VARCHAR     NOT NULL,
    ts            TIMESTAMPTZ NOT NULL,
    risk          DOUBLE      NOT NULL,
    model_version VARCHAR     NOT NULL,
    stored_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (machine_id, kind, ts, state)
);
CREATE TABLE IF NOT EXISTS alert_timelines (
    machine_id VARCHAR     NOT NULL PRIMARY KEY,
    timeline   JSON        NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS model_metrics (
    model_name     VARCHAR     NOT NULL,
    model_version  VARCHAR     NOT NULL,
    kind           VARCHAR     NOT NULL,
    window_start   TIMESTAMPTZ NOT NULL,
    window_end     TIMESTAMPTZ NOT NULL,
    examples       BIGINT      NOT NULL,
    tp             BIGINT      NOT NULL,
    fp             BIGINT      NOT NULL,
    fn             BIGINT      NOT NULL,
    tn             BIGINT      NOT NULL,
    precision      DOUBLE,
    recall         DOUBLE,
    failures       BIGINT      NOT NULL,
    failures_caught BIGINT     NOT NULL,
    mean_lead_time_h DOUBLE,
    threshold      DOUBLE      NOT NULL,
    computed_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (model_name, model_version, kind, window_start, window_end)
);
CREATE TABLE IF NOT EXISTS drift (
    model_name    VARCHAR     NOT NULL,
    model_version VARCHAR     NOT NULL,
    feature       VARCHAR     NOT NULL,
    window_start  TIMESTAMPTZ NOT NULL,
    window_end    TIMESTAMPTZ NOT NULL,
    psi           DOUBLE      NOT NULL,
    observations  BIGINT      NOT NULL,
    drifted       BOOLEAN     NOT NULL,
    computed_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (model_name, model_version, feature, window_start, window_end)
);
CREATE TABLE IF NOT EXISTS consumer_offsets (
    consumer    VARCHAR NOT NULL,
    topic       VARCHAR NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset BIGINT  NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);
-- Each machine's newest prediction (by window_end, then seq), kept by the writer in the same transaction as the
-- predictions it comes from (LATEST_PREDICTIONS_UPSERT): "at risk now" reads a row per machine, not 10 M rows.
CREATE TABLE IF NOT EXISTS latest_predictions (
    machine_id     VARCHAR   NOT NULL PRIMARY KEY,
    edge_id        VARCHAR   NOT NULL,
    seq            BIGINT    NOT NULL,
    window_start   TIMESTAMPTZ NOT NULL,
    window_end     TIMESTAMPTZ NOT NULL,
    horizon_h      DOUBLE    NOT NULL,
    risk           JSON      NOT NULL,
    max_risk       DOUBLE    NOT NULL,
    top_kind       VARCHAR   NOT NULL,
    model_name     VARCHAR   NOT NULL,
    model_version  VARCHAR   NOT NULL,
    emitted_at     TIMESTAMPTZ NOT NULL,
    ingested_at    TIMESTAMPTZ NOT NULL,
    threshold      DOUBLE
);
-- The model's threshold, so "at risk" judges each machine at its model's operating point. A store made before it
-- gains the column (NULL until the machine's next prediction: judged at the default).
ALTER TABLE latest_predictions ADD COLUMN IF NOT EXISTS threshold DOUBLE;
"""
    + HEARTBEATS_TABLE
    + LEDGER_TABLE
    + """
-- Opt-in per-sensor summaries (the precursor.telemetry topic): what the dashboard draws as sensor lines. One row per
-- sensor of a TelemetrySummary; samples: readings with a value for the sensor, readings: all of the period's.
CREATE TABLE IF NOT EXISTS telemetry_summaries (
    edge_id      VARCHAR NOT NULL,
    seq          BIGINT  NOT NULL,
    machine_id   VARCHAR NOT NULL,
    sensor       VARCHAR NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    window_end   TIMESTAMPTZ NOT NULL,
    value_mean   DOUBLE  NOT NULL,
    value_min    DOUBLE  NOT NULL,
    value_max    DOUBLE  NOT NULL,
    value_last   DOUBLE  NOT NULL,
    samples      BIGINT  NOT NULL,
    readings     BIGINT  NOT NULL,
    ingested_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (edge_id, seq, sensor)
);
"""
)

LATEST_PREDICTIONS_UPSERT = """
INSERT INTO latest_predictions
SELECT machine_id, edge_id, seq, window_start, window_end, horizon_h, risk, max_risk, top_kind, model_name,
       model_version, emitted_at, ingested_at, threshold
FROM incoming
QUALIFY row_number() OVER (PARTITION BY machine_id ORDER BY window_end DESC, seq DESC) = 1
ON CONFLICT (machine_id) DO UPDATE SET
    edge_id = excluded.edge_id, seq = excluded.seq, window_start = excluded.window_start,
    window_end = excluded.window_end, horizon_h = excluded.horizon_h, risk = excluded.risk,
    max_risk = excluded.max_risk, top_kind = excluded.top_kind, model_name = excluded.model_name,
    model_version = excluded.model_version, emitted_at = excluded.emitted_at, ingested_at = excluded.ingested_at,
    threshold = excluded.threshold
WHERE (excluded.window_end, excluded.seq) > (latest_predictions.window_end, latest_predictions.seq)
"""
"""Keeps ``latest_predictions`` current from a batch registered as ``incoming``; run it after inserting the batch."""

WRITABLE_TABLES = frozenset(
    {
        "predictions",
        "events",
        "heartbeats",
        "telemetry_summaries",
        "alerts",
        "alert_timelines",
        "model_metrics",
        "drift",
    }
)


_WRITERS: dict[Path, threading.RLock] = {}
_WRITERS_GUARD = threading.Lock()


def _writer_lock(path: Path) -> threading.RLock:
    """One lock per store file and process. DuckDB shares one database between a process's connections to a file,
    and two of them writing at once (parallel pipeline workers in one SDK harness, as Flink runs them) abort each
    other with a write-write conflict; the file lock only keeps other processes out."""
    key = path.resolve()
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, threading.RLock())


@contextmanager
def connect(
    path: StoreLocation, *, read_only: bool = False, wait_s: float = 10.0
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store, retrying while another process holds its lock, and close it afterwards.

    Writers in one process take turns (see :func:`_writer_lock`); readers do not wait for them. A
    ``postgresql://`` URL opens that database instead (:mod:`precursor.store.postgres`; its connection answers the
    same calls).
    """
    if is_postgres(path):
        from precursor.store import postgres  # psycopg and sqlglot: only for a PostgreSQL store

        with postgres.connect(str(path), schema=None if read_only else SCHEMA, wait_s=wait_s) as pg:
            if read_only and pg.execute("SELECT to_regclass('predictions')").fetchone() == (None,):
                raise FileNotFoundError(f"no prediction store in {redact(path)}: run `precursor pipeline run` first")
            yield pg  # type: ignore[misc]  # the calls the store makes of a DuckDB connection
        return
    path = Path(path)
    if read_only and not path.exists():
        raise FileNotFoundError(f"no prediction store at {path}: run `precursor pipeline run` first")
    path.parent.mkdir(parents=True, exist_ok=True)
    if read_only:
        with _open(path, read_only=True, wait_s=wait_s) as con:
            yield con
        return
    with _writer_lock(path), _open(path, read_only=False, wait_s=wait_s) as con:
        yield con


@contextmanager
def _open(path: Path, *, read_only: bool, wait_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as err:
            if "lock" not in str(err).lower() or time.monotonic() > deadline:
                raise StoreBusy(f"prediction store {path} is busy: {err}") from err
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
    try:
        con.execute("SET TimeZone = 'UTC'")
        if not read_only:
            _ensure_schema(con)
        yield con
    finally:
        con.close()


_MIGRATIONS = "heartbeats with trust; telemetry summaries keyed by (edge_id, seq)"
SCHEMA_DIGEST = hashlib.sha256(f"{SCHEMA}\n{_MIGRATIONS}".encode()).hexdigest()[:16]
"""Names the schema (and the migrations) this code writes; a store file keeps the digest of the schema it was last
brought to in ``store_schema``."""


def _ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Bring the file to this code's schema, unless its ``store_schema`` row says it is there already.

    Every writing connection used to run the migrations and the whole DDL, about 7 ms of CPU each, several times in
    every pipeline run (a third of opening the file); one small read replaces them once the file is current. A store
    written by another version of this code carries another digest, so it is brought up to date (the DDL only ever
    adds) and takes this one.
    """
    try:
        current = con.execute("SELECT digest FROM store_schema").fetchall()  # all: no result left open
    except duckdb.CatalogException:  # a new file, or one from before the digest
        current = []
    if current == [(SCHEMA_DIGEST,)]:
        return
    _migrate_heartbeats(con)
    _set_aside_old_telemetry_summaries(con)
    con.execute(SCHEMA)
    con.execute("CREATE TABLE IF NOT EXISTS store_schema (digest VARCHAR NOT NULL)")
    with _transaction(con):
        con.execute("DELETE FROM store_schema")
        con.execute("INSERT INTO store_schema VALUES (?)", [SCHEMA_DIGEST])


def _set_aside_old_telemetry_summaries(con: duckdb.DuckDBPyConnection) -> None:
    """A summaries table of the first layout (keyed by machine, sensor and time; no edge sent it, so it has no
    (edge_id, seq)) is renamed ``telemetry_summaries_v1``, kept but no longer read, and the new one is made."""
    columns, keyed = con.execute(
        "SELECT count(*), count(*) FILTER (column_name = 'edge_id') FROM duckdb_columns() "
        "WHERE database_name = current_database() AND table_name = 'telemetry_summaries'"
    ).fetchone() or (0, 0)
    if columns and not keyed:
        con.execute("ALTER TABLE telemetry_summaries RENAME TO telemetry_summaries_v1")


def _migrate_heartbeats(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild a heartbeats table of the first layout (no trust, keyed by (edge_id, seq) alone), in one transaction."""
    columns, trust = con.execute(
        "SELECT count(*), count(*) FILTER (column_name = 'trust') FROM duckdb_columns() "
        "WHERE database_name = current_database() AND table_name = 'heartbeats'"
    ).fetchone() or (0, 0)
    if columns and not trust:
        con.execute("BEGIN TRANSACTION")
        con.execute(HEARTBEATS_FROM_V1)
        con.execute("COMMIT")


@dataclass(frozen=True)
class Offset:
    topic: str
    partition: int
    next_offset: int


@contextmanager
def _transaction(con: Any) -> Iterator[None]:
    """One transaction on either backend; rolled back if the block raises."""
    if _on_postgres(con):
        with con.raw.transaction():
            yield
        return
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _on_postgres(con: Any) -> bool:
    """Whether ``con`` is a PostgreSQL connection (:mod:`precursor.store.postgres`, not imported for a DuckDB store)."""
    return not isinstance(con, duckdb.DuckDBPyConnection)


def _insert(con: Any, table: str, batch: pa.Table, *, replace: bool, covers: Coverage | None) -> int:
    """``batch`` into ``table`` and the ledger rows of ``covers``, in one transaction; returns the rows written."""
    ledger = covers.rows(datetime.now(UTC)) if covers else []
    if _on_postgres(con):
        if batch.num_rows == 0:
            if ledger:
                with _transaction(con):
                    con.executemany(LEDGER_INSERT, ledger)
            return 0
        from precursor.store import postgres

        after = LATEST_PREDICTIONS_UPSERT if table == "predictions" else None
        return postgres.insert_table(con, table, batch, replace=replace, after=after, ledger=ledger)
    # DuckDB takes the ledger rows as one Arrow table (its executemany runs the statement once per row, about 2 ms
    # each). Both tables are registered outside the transaction: a failed one refuses every call until it is rolled
    # back, unregistering included, which would hide the error that failed it.
    registered = []
    if batch.num_rows:
        con.register("incoming", batch)
        registered.append("incoming")
    if ledger:
        con.register("ledger_rows", pa.table(list(zip(*ledger, strict=True)), names=LEDGER_COLUMNS))
        registered.append("ledger_rows")
    written = None
    try:
        with _transaction(con):
            if batch.num_rows:
                columns = ", ".join(batch.column_names)
                verb = "INSERT OR REPLACE" if replace else "INSERT"
                conflict = "" if replace else " ON CONFLICT DO NOTHING"
                written = con.execute(
                    f"{verb} INTO {table} ({columns}) SELECT {columns} FROM incoming{conflict}"
                ).fetchone()
                if table == "predictions":
                    con.execute(LATEST_PREDICTIONS_UPSERT)
            if ledger:
                con.execute(f"INSERT INTO consumed_ranges ({', '.join(LEDGER_COLUMNS)}) SELECT * FROM ledger_rows")
    finally:
        for name in registered:
            con.unregister(name)
    return int(written[0]) if written else 0


class StoreWriter:
    """Many writes, for a pipeline stage that writes again and again (a DoFn keeps one from setup to teardown).

    On PostgreSQL they share one connection, open until :meth:`close`: many writers share the server, and a new
    connection costs a password exchange (about half of a 500-row write, ``bench/store_write_cost.py``). On DuckDB each
    write opens the file and lets it go at once, as a one-off write does: the file takes one writing process at a
    time, so a connection held any longer (a worker's life, or a bundle while it waits for more input) would lock out
    the workers in other processes (a Flink cluster's) and every reader, and within the process hold the writer lock
    (:func:`connect`) that the other stages' writers wait on.
    """

    def __init__(self, location: StoreLocation) -> None:
        self.location: StoreLocation = str(location) if is_postgres(location) else Path(location)
        self._open: ExitStack | None = None
        self._con: Any = None

    def __repr__(self) -> str:
        return f"StoreWriter({redact(self.location)!r})"

    def insert_table(
        self, table: str, batch: pa.Table, *, replace: bool = False, covers: Coverage | None = None
    ) -> int:
        """As :meth:`PredictionStore.insert_table`; ``covers``: the Kafka positions these rows account for, recorded
        in the same transaction (:mod:`precursor.store.ledger`)."""
        if table not in WRITABLE_TABLES:
            raise ValueError(f"table={table!r}: not a store table; one of {sorted(WRITABLE_TABLES)}")
        if batch.num_rows == 0 and not covers:
            return 0
        return self._write(table, batch, replace, covers)

    def cover(self, covers: Coverage) -> None:
        """Record positions that became no row (dead letters, dropped duplicates) as consumed."""
        if covers:
            self._write("ledger only", pa.table({}), False, covers)

    def _write(self, table: str, batch: pa.Table, replace: bool, covers: Coverage | None) -> int:
        if self._con is None:
            stack = ExitStack()
            self._con = stack.enter_context(connect(self.location))
            self._open = stack
        kept = False
        try:
            written = _insert(self._con, table, batch, replace=replace, covers=covers)
            kept = is_postgres(self.location)
            return written
        finally:
            if not kept:  # DuckDB's file is let go after each write; a connection that failed is never reused
                self.close()

    def close(self) -> None:
        stack, self._open, self._con = self._open, None, None
        if stack is not None:
            stack.close()


class PredictionStore:
    """Writes and reads the store file. Each call opens and closes the file, so no lock is held between calls.

    Rows come as Arrow tables in the layout of their one writer (:mod:`pipelines.ingest`, :mod:`pipelines.alerts`).
    """

    def __init__(self, path: StoreLocation) -> None:
        self.location: StoreLocation = str(path) if is_postgres(path) else Path(path)
        self.path = Path(path) if not is_postgres(path) else None

    def __repr__(self) -> str:
        return f"PredictionStore({redact(self.location)!r})"

    def _exists(self) -> bool:
        return self.path is None or self.path.exists()

    def insert_table(
        self, table: str, batch: pa.Table, *, replace: bool = False, covers: Coverage | None = None
    ) -> int:
        """Insert an Arrow table whose column names are ``table``'s; returns how many rows were written.

        Rows whose key is already stored are skipped, or with ``replace`` overwrite the stored row (for state and
        metrics that a later run recomputes). ``covers``: Kafka positions recorded as consumed in the same
        transaction.
        """
        writer = StoreWriter(self.location)
        try:
            return writer.insert_table(table, batch, replace=replace, covers=covers)
        finally:
            writer.close()

    def alert_timelines(self) -> dict[str, str]:
        """machine_id -> the alert timeline (JSON) the last pipeline run left for it."""
        if not self._exists():
            return {}
        with connect(self.location) as con:
            return dict(con.execute("SELECT machine_id, timeline::VARCHAR FROM alert_timelines").fetchall())

    def offsets(self, consumer: str, topic: str) -> dict[int, int]:
        """partition -> next offset to read, for one consumer of one topic (as folded by the last finished run)."""
        if not self._exists():
            return {}
        with connect(self.location) as con:
            rows = con.execute(
                "SELECT partition, next_offset FROM consumer_offsets WHERE consumer = ? AND topic = ?",
                [consumer, topic],
            ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def consumed(self, consumer: str, topic: str, stages: Sequence[str] = ()) -> dict[int, Spans]:
        """partition -> the offsets ``consumer`` has finished with: below its folded next offset, or recorded in
        the ledger by every one of ``stages`` (by default the consumer itself) in the writes that committed."""
        return self.progress(consumer, topic, stages)[1]

    def progress(
        self, consumer: str, topic: str, stages: Sequence[str] = ()
    ) -> tuple[dict[int, int], dict[int, Spans]]:
        """The consumer's folded next offsets (partition -> offset) and what it has consumed (:meth:`consumed`)."""
        if not self._exists():
            return {}, {}
        stages = tuple(stages) or (consumer,)
        with connect(self.location) as con:
            folded = con.execute(
                "SELECT partition, next_offset FROM consumer_offsets WHERE consumer = ? AND topic = ?",
                [consumer, topic],
            ).fetchall()
            ledgers = [
                con.execute(
                    "SELECT partition, spans FROM consumed_ranges WHERE consumer = ? AND topic = ?", [stage, topic]
                ).fetchall()
                for stage in stages
            ]
        next_offsets = {int(p): int(o) for p, o in folded}
        return next_offsets, consumed(next_offsets, ledgers)

    def commit_offsets(self, consumer: str, offsets: Iterable[Offset], *, stages: Sequence[str] = ()) -> None:
        """Fold a finished run's progress in: offsets never move backwards, and the ledger rows of ``stages`` that
        lie wholly below them are deleted, in one transaction. Call only once everything below them is consumed."""
        now = datetime.now(UTC)
        offsets = list(offsets)
        rows = [(consumer, o.topic, o.partition, o.next_offset, now) for o in offsets]
        if not rows:
            return
        stages = tuple(stages) or (consumer,)
        with connect(self.location) as con, _transaction(con):
            con.executemany(
                "INSERT INTO consumer_offsets VALUES (?, ?, ?, ?, ?) ON CONFLICT (consumer, topic, partition) "
                "DO UPDATE SET next_offset = greatest(consumer_offsets.next_offset, excluded.next_offset), "
                "updated_at = excluded.updated_at",
                rows,
            )
            con.executemany(
                "DELETE FROM consumed_ranges WHERE consumer = ? AND topic = ? AND partition = ? AND end_offset <= ?",
                [(stage, o.topic, o.partition, o.next_offset) for stage in stages for o in offsets],
            )
