"""The per-message and per-row sizes that docs/SCALE.md multiplies by a fleet: bytes of a serialized Prediction on
the wire and in a Kafka log, and bytes per stored prediction in DuckDB and in PostgreSQL.

Predictions are built field by field as the edge agent builds them (``edge_agent.agent.Agent._prediction``) and
serialized by the contract's own ``encode`` (compact JSON): the int8 LM's risk per failure kind (the simulator's five
kinds and ``failure``, float64 as the runtime's calibration returns them), its threshold, and on an explained share
of windows three reasons shaped as ``models.edge.explain`` writes them; the drift z-score baseline sends one risk and no
threshold. Identifiers are sized for a million machines (``plant-0421-gw-03``, ``plant-0421-pump-000123``).

- Kafka: the edge's own publisher (``KafkaPublisher``: key = machine_id, ``acks=all``) sends ``--kafka`` predictions
  to a broker started for the run, and the bytes of the predictions topic's log segments (one replica) are divided
  by the messages: the wire size plus Kafka's record and batch framing, uncompressed as the edge sends them.
- Store: ``--rows`` predictions over 1,000 machines in ingest's Arrow batches of 5,000 (``PredictionStore
  .insert_table``, ``latest_predictions`` kept up in the same transaction), into a fresh DuckDB file (its size after a
  checkpoint, less the empty store's) and a fresh PostgreSQL database on a throwaway server (``pg_database_size``
  less the empty store's, and the ``predictions`` table with its indexes and TOAST alone).

    .venv/bin/python bench/scale_inputs.py                         # 200,000 rows, 50,000 messages, 1 % explained
    .venv/bin/python bench/scale_inputs.py --explained 0.06 --no-kafka
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from kafka_throughput import local_broker  # noqa: E402

from edge_agent.identity import EdgeIdentity, agent_build  # noqa: E402
from edge_agent.publisher import KafkaPublisher  # noqa: E402
from infra.postgres_server import LocalPostgres  # noqa: E402
from pipelines.ingest import heartbeat_batch, prediction_batch  # noqa: E402
from pipelines.records import heartbeat_record, prediction_record  # noqa: E402
from precursor.contracts.messages import (  # noqa: E402
    EdgeFlow,
    Heartbeat,
    HeartbeatSignature,
    Prediction,
    Reason,
    ReasonDetail,
    encode,
)
from precursor.store import PredictionStore  # noqa: E402
from precursor.store.db import connect  # noqa: E402

KINDS = ("bearing", "overheat", "seal_leak", "electrical", "clog")
MACHINES = 1000
BATCH = 5000
START = datetime(2026, 1, 1, tzinfo=UTC)
# The store keeps a heartbeat's key id, not its signature: one stand-in serves every stored row.
SIGNED = HeartbeatSignature(key_id="89ad81ba5de73f16", value="-")  # a key id as `models.edge.signing.key_id` makes it


def reasons(rng: np.random.Generator) -> list[Reason]:
    """Three reasons in the shapes ``models.edge.explain`` writes: a sensor statistic in a block, an error code, a
    part.
    """
    drops = sorted(rng.uniform(0.02, 0.4, 3), reverse=True)
    return [
        Reason(
            kind="sensor",
            name="vibration_rms",
            risk_drop=float(drops[0]),
            detail=ReasonDetail(statistic="mean", block=3, from_h=1.5, to_h=0.0),
            text="vibration_rms level high in the last 1.5 h",
        ),
        Reason(
            kind="event",
            name="error:E310",
            risk_drop=float(drops[1]),
            detail=ReasonDetail(count=3),
            text="error E310 three times",
        ),
        Reason(
            kind="event",
            name="maintenance:bearing",
            risk_drop=float(drops[2]),
            detail=ReasonDetail(age_h=float(round(rng.uniform(100, 4000), 1))),
            text="bearing last serviced 61 days ago",
        ),
    ]


def predictions(count: int, *, model: str, explained: float, seed: int = 0) -> Iterator[Prediction]:
    """``count`` predictions of one edge over 1,000 machines, a window per machine every 10 minutes."""
    rng = np.random.default_rng(seed)
    for seq in range(count):
        end = START + timedelta(minutes=10 * (seq // MACHINES))
        common = {
            "edge_id": "plant-0421-gw-03",
            "seq": seq,
            "machine_id": f"plant-0421-pump-{seq % MACHINES:06d}",
            "window_start": end - timedelta(hours=6),
            "window_end": end,
            "horizon_h": 24.0,
            "emitted_at": end + timedelta(microseconds=int(rng.integers(1, 2_000_000))),
        }
        if model == "drift-zscore":
            yield Prediction(**common, risk={"failure": float(rng.beta(1, 20))}, model_name="drift-zscore",
                             model_version="1")  # fmt: skip
            continue
        kinds = rng.dirichlet(np.ones(len(KINDS))) * rng.beta(1, 20)
        risk = {"failure": float(kinds.sum()), **{k: float(v) for k, v in zip(KINDS, kinds, strict=True)}}
        yield Prediction(
            **common,
            risk=risk,
            model_name="precursor-lm",
            model_version="2026.12.02.143238",
            threshold=0.268_913_421_5,
            reasons=reasons(rng) if rng.random() < explained else None,
        )


def heartbeat(edge: int, seq: int, rng: np.random.Generator) -> Heartbeat:
    """A heartbeat as an edge of 100 machines sends one every 30 s: its build, model, and the flow figures."""
    scoring = float(rng.uniform(0.3, 0.6))
    return Heartbeat(
        edge_id=f"plant-{edge:04d}-gw-03",
        seq=seq,
        timestamp=START + timedelta(seconds=30 * seq, microseconds=int(rng.integers(0, 1_000_000))),
        model_name="precursor-lm",
        model_version="2026.12.02.143238",
        model_sha256="ab" * 32,
        outbox_depth=int(rng.integers(0, 40)),
        lag_s=float(rng.uniform(0, 2)),
        machines=100,
        agent=agent_build(),
        flow=EdgeFlow(
            interval_s=round(float(rng.uniform(29.9, 30.2)), 3),  # the flow meter rounds it; the rest it does not
            readings_per_s=float(rng.uniform(9.5, 10.5)),
            windows_per_s=float(rng.uniform(0.15, 0.18)),
            predictions_per_s=float(rng.uniform(0.15, 0.18)),
            scoring_ms_p50=scoring,
            scoring_ms_p95=scoring * float(rng.uniform(1.5, 3)),
            scoring_busy=float(rng.uniform(0, 1e-4)),
            cpu_s=1.1e-3 * 5 * seq,
            scoring_cpu_s=0.4e-3 * 5 * seq,
            predictions=5 * seq,
        ),
    )


def heartbeat_size() -> int:
    """Bytes of one heartbeat as an enrolled edge sends it, signed by a real ed25519 key."""
    identity = EdgeIdentity("plant-0421-gw-03", Ed25519PrivateKey.generate())
    return len(encode(identity.sign(heartbeat(421, 1_234_567, np.random.default_rng(0)))))


def wire_sizes(explained: float) -> dict[str, float]:
    """Mean bytes of the JSON value (and the machine_id key) per kind of prediction, over 2,000 of each."""
    sample = 2000
    sizes = {
        "int8 LM, quiet (no reasons)": [len(encode(p)) for p in predictions(sample, model="lm", explained=0.0)],
        "int8 LM, explained (3 reasons)": [len(encode(p)) for p in predictions(sample, model="lm", explained=1.0)],
        "drift z-score": [len(encode(p)) for p in predictions(sample, model="drift-zscore", explained=0.0)],
        f"int8 LM, {explained:.0%} explained": [
            len(encode(p)) for p in predictions(sample, model="lm", explained=explained)
        ],
    }
    key = len(b"plant-0421-pump-000123")
    print(f"one quiet LM prediction as the edge sends it: {encode(next(predictions(1, model='lm', explained=0.0)))!r}")
    print(f"key (machine_id): {key} bytes")
    for name, values in sizes.items():
        print(f"value, {name}: mean {np.mean(values):.0f} bytes (min {min(values)}, max {max(values)})")
    print(f"heartbeat, signed, with flow figures: {heartbeat_size()} bytes")
    # Kafka compresses a producer batch as a whole; the edge sends uncompressed, so this is a lever, not the default.
    values = [encode(p) for p in predictions(sample, model="lm", explained=explained)]
    chunks = [b"".join(values[i : i + 100]) for i in range(0, sample, 100)]
    ratio = sum(len(zlib.compress(c, 6)) for c in chunks) / sum(len(c) for c in chunks)
    print(f"gzip (level 6) of batches of 100 such values: {ratio:.2f} of their size")
    return {name: float(np.mean(values)) for name, values in sizes.items()}


def kafka_log_bytes(count: int, explained: float) -> None:
    """Bytes per prediction in the broker's log (one replica), sent by the edge's own publisher."""
    with local_broker(report=lambda _: None) as broker:
        settings = broker.kafka_settings()
        publisher = KafkaPublisher(settings)
        payload = 0
        for p in predictions(count, model="lm", explained=explained):
            value = encode(p)
            payload += len(value)
            publisher.send(p)
        publisher.close()
        time.sleep(1)  # the broker appends to its segment files as it acknowledges; nothing is left to flush
        logs = [f for f in broker.data_dir.glob(f"{settings.topics.predictions}-*/*.log") if f.is_file()]
        on_disk = sum(f.stat().st_size for f in logs)
        print(
            f"kafka log: {count:,} predictions ({explained:.0%} explained) -> {on_disk:,} bytes in "
            f"{len(logs)} partition logs: {on_disk / count:.0f} bytes per message on disk "
            f"(value {payload / count:.0f}, so {(on_disk - payload) / count:.0f} bytes of key and framing)"
        )


def in_batches(records: Iterator[tuple], to_table: Callable[[list, datetime], pa.Table]) -> list[pa.Table]:
    """Record tuples as ingest hands them to the store: Arrow tables of ``BATCH`` rows."""
    now = datetime.now(UTC)
    out, chunk = [], []
    for record in records:
        chunk.append(record)
        if len(chunk) == BATCH:
            out.append(to_table(chunk, now))
            chunk = []
    if chunk:
        out.append(to_table(chunk, now))
    return out


def loads(rows: int, explained: float) -> dict[str, list[pa.Table]]:
    """``rows`` predictions over 1,000 machines, and ``rows`` heartbeats of 1,000 edges, as the store gets them."""
    rng = np.random.default_rng(1)
    return {
        "predictions": in_batches(
            (
                prediction_record(p, partition=p.seq % 6, offset=p.seq)
                for p in predictions(rows, model="lm", explained=explained)
            ),
            prediction_batch,
        ),
        "heartbeats": in_batches(
            (
                heartbeat_record(
                    heartbeat(i % 1000, i // 1000, rng).model_copy(update={"signature": SIGNED}),
                    partition=0,
                    offset=i,
                    trust="verified",
                    trust_reason=None,
                    model_known=True,
                )
                for i in range(rows)
            ),
            heartbeat_batch,
        ),
    }


def duckdb_bytes(folder: Path, tables: dict[str, list[pa.Table]]) -> None:
    import duckdb

    path = folder / "store.duckdb"
    with connect(path) as con:  # the schema, empty
        con.execute("CHECKPOINT")
    store = PredictionStore(path)
    for table, batches in tables.items():
        before = path.stat().st_size
        for batch in batches:
            store.insert_table(table, batch)
        with duckdb.connect(str(path)) as con:
            con.execute("CHECKPOINT")
            stored = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        rows = sum(b.num_rows for b in batches)
        assert stored == rows, (table, stored, rows)
        after = path.stat().st_size
        print(f"duckdb {table}: {rows:,} rows: file {before:,} -> {after:,} bytes: {(after - before) / rows:.0f} a row")


def postgres_bytes(folder: Path, tables: dict[str, list[pa.Table]]) -> None:
    import psycopg

    server = LocalPostgres(folder / "pg")
    server.up(report=lambda _: None)
    os.environ["PGPASSFILE"] = str(server.pgpass)
    try:
        url = server.create_database("scale")
        with connect(url):  # the schema, empty
            pass
        store = PredictionStore(url)
        for table, batches in tables.items():
            with psycopg.connect(url, autocommit=True) as con:
                before = con.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            for batch in batches:
                store.insert_table(table, batch)
            with psycopg.connect(url, autocommit=True) as con:
                con.execute("VACUUM ANALYZE")  # settles the free-space and visibility maps, as a running server does
                stored, after, total, heap = con.execute(
                    f"SELECT (SELECT count(*) FROM {table}), pg_database_size(current_database()), "
                    f"pg_total_relation_size('{table}'), pg_relation_size('{table}')"
                ).fetchone()
            rows = sum(b.num_rows for b in batches)
            assert stored == rows, (table, stored, rows)
            print(
                f"postgresql {table}: {rows:,} rows: database {before:,} -> {after:,} bytes: "
                f"{(after - before) / rows:.0f} a row; the table {total / rows:.0f} a row with its indexes "
                f"({heap / rows:.0f} heap)"
            )
    finally:
        server.down(report=lambda _: None, immediate=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="predictions, and heartbeats, stored per backend")
    parser.add_argument("--kafka", type=int, default=50_000, help="predictions sent through a broker")
    parser.add_argument("--no-kafka", action="store_true", help="skip the broker")
    parser.add_argument("--explained", type=float, default=0.01, help="share of windows that carry reasons")
    args = parser.parse_args()
    wire_sizes(args.explained)
    if not args.no_kafka:
        kafka_log_bytes(args.kafka, args.explained)
    tables = loads(args.rows, args.explained)
    with tempfile.TemporaryDirectory(prefix="scale-store-") as folder:
        Path(folder).chmod(0o755)  # the PostgreSQL server may run as another account
        duckdb_bytes(Path(folder), tables)
        postgres_bytes(Path(folder), tables)


if __name__ == "__main__":
    main()
