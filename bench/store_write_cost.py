"""What a store write costs, on DuckDB and on PostgreSQL: with its Kafka offsets in the same transaction (the ledger,
:mod:`precursor.store.ledger`) or without, and over one connection per writer or a new connection per write.

Each write inserts ``--rows`` new predictions (as ingest's writer builds them) from one bundle of ``--writes``; the
PostgreSQL server is a temporary local one (``infra.postgres_server``). Prints milliseconds per write: the median of
the writes after the first (which makes the tables), the lowest of ``--rounds`` rounds that take the variants in
turn (on a shared machine the least disturbed round is the one to trust).

    .venv/bin/python bench/store_write_cost.py --writes 60 --rows 500
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from infra.postgres_server import LocalPostgres
from pipelines.ingest import prediction_batch
from pipelines.records import PredictionRecord
from precursor.store import PredictionStore
from precursor.store.db import StoreWriter
from precursor.store.ledger import Coverage

HOUR_US = 3_600_000_000


def batches(writes: int, rows: int) -> list[tuple[pa.Table, Coverage]]:
    """``writes`` batches of new predictions, each with the positions (6 partitions) it covers."""
    out = []
    for w in range(writes):
        records = [
            PredictionRecord(
                "edge-1", w * rows + i, f"pump-{i % 200:04d}", (w + 1) * HOUR_US, (w + 2) * HOUR_US, 24.0,
                (("failure", 0.1),), "baseline", "1", (w + 2) * HOUR_US, i % 6, w * rows + i,
            )
            for i in range(rows)
        ]  # fmt: skip
        covers = Coverage.of(["ingest-v0"], "bench.predictions", [(r.partition, r.offset) for r in records])
        out.append((prediction_batch(records, datetime.now(UTC)), covers))
    return out


def per_write_ms(write: Callable[[pa.Table, Coverage], None], work: list[tuple[pa.Table, Coverage]]) -> float:
    times = []
    for batch, covers in work:
        started = time.perf_counter()
        write(batch, covers)
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times[1:])


def measure(location: str | Path, work: list[tuple[pa.Table, Coverage]], variant: str) -> float:
    if variant == "new connection per write, no offsets":  # as the writer did before the ledger
        store = PredictionStore(location)

        def write_alone(batch: pa.Table, _: Coverage) -> None:
            store.insert_table("predictions", batch)

        return per_write_ms(write_alone, work)
    writer = StoreWriter(location)
    try:
        with_offsets = variant.endswith("with offsets")

        def write(batch: pa.Table, covers: Coverage) -> None:
            writer.insert_table("predictions", batch, covers=covers if with_offsets else None)

        return per_write_ms(write, work)
    finally:
        writer.close()


VARIANTS = (
    "new connection per write, no offsets",
    "writer's connection, no offsets",
    "writer's connection, with offsets",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=60)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="precursor-bench-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "pg")
    server.up(report=lambda _: None)
    os.environ["PGPASSFILE"] = str(server.pgpass)
    try:
        print(f"{args.writes} writes of {args.rows} predictions; load average {os.getloadavg()[0]:.2f}")
        print(f"{'variant':<40} {'DuckDB ms/write':>16} {'PostgreSQL ms/write':>20}")
        best: dict[tuple[str, str], float] = {}
        for round_ in range(args.rounds):
            for i, variant in enumerate(VARIANTS):
                for backend in ("duckdb", "postgresql"):
                    work = batches(args.writes, args.rows)
                    name = f"bench_{round_}_{i}"
                    location = root / f"{name}.duckdb" if backend == "duckdb" else server.create_database(name)
                    ms = measure(location, work, variant)
                    best[variant, backend] = min(ms, best.get((variant, backend), ms))
        for variant in VARIANTS:
            print(f"{variant:<40} {best[variant, 'duckdb']:>16.1f} {best[variant, 'postgresql']:>20.1f}")
    finally:
        server.down(report=lambda _: None, immediate=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
