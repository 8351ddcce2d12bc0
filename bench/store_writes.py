"""Store write throughput, DuckDB against PostgreSQL: the batches ingest writes (``PredictionStore.insert_table``,
``latest_predictions`` kept in the same transaction), by one writer and by several processes writing at once.

Starts a throwaway PostgreSQL server (initdb in a temporary folder, a database per measurement). Each writer inserts
``--rows`` predictions of its own (distinct ``(edge_id, seq)``) in batches of ``--batch``, over 1,000 machines, then
the whole set once more (every row found already stored, as a rerun would). DuckDB takes one writer at a time, so its
figure is for one process.

    .venv/bin/python bench/store_writes.py                      # 200,000 rows, batches of 5,000, 1 and 2 writers
    .venv/bin/python bench/store_writes.py --rows 50000 --writers 4
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from infra.postgres_server import LocalPostgres  # noqa: E402
from pipelines.ingest import prediction_batch  # noqa: E402
from pipelines.records import prediction_record  # noqa: E402
from precursor.contracts.messages import Prediction  # noqa: E402
from precursor.store import PredictionStore  # noqa: E402
from precursor.store.queries import reading  # noqa: E402

MACHINES = 1000
START = datetime(2026, 1, 1, tzinfo=UTC)


def batches(writer: int, rows: int, size: int) -> list:
    """``rows`` predictions of edge ``bench-<writer>`` as ingest's Arrow batches of ``size``."""
    out, records = [], []
    now = datetime.now(UTC)
    for seq in range(rows):
        machine = f"m-{seq % MACHINES:04d}"
        end = START + timedelta(minutes=10 * (seq // MACHINES))
        p = Prediction(
            edge_id=f"bench-{writer}", seq=seq, machine_id=machine, window_start=end - timedelta(hours=6),
            window_end=end, horizon_h=24.0, risk={"failure": (seq % 97) / 97}, model_name="lm", model_version="1",
        )  # fmt: skip
        records.append(prediction_record(p, partition=writer, offset=seq))
        if len(records) == size:
            out.append(prediction_batch(records, now))
            records = []
    if records:
        out.append(prediction_batch(records, now))
    return out


def write(location: str, writer: int, rows: int, size: int, start_at: float, queue: multiprocessing.Queue) -> None:
    prepared = batches(writer, rows, size)
    store = PredictionStore(location)
    while time.time() < start_at:  # all writers start together
        time.sleep(0.005)
    started = time.perf_counter()
    new = sum(store.insert_table("predictions", b) for b in prepared)
    first = time.perf_counter() - started
    started = time.perf_counter()
    again = sum(store.insert_table("predictions", b) for b in prepared)
    queue.put((writer, new, first, again, time.perf_counter() - started))


def measure(location: str, writers: int, rows: int, size: int) -> dict[str, float]:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    start_at = time.time() + 3 + writers  # time to build the batches first
    procs = [
        multiprocessing.Process(target=write, args=(location, w, rows, size, start_at, queue)) for w in range(writers)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    with reading(location) as store:
        stored = store.rows("SELECT count(*) AS n FROM predictions")[0]["n"]
    new = sum(r[1] for r in results)
    assert new == stored == writers * rows and all(r[3] == 0 for r in results), (new, stored, results)
    first = max(r[2] for r in results)
    again = max(r[4] for r in results)
    return {"rows_per_s": new / first, "rerun_rows_per_s": new / again}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="predictions per writer")
    parser.add_argument("--batch", type=int, default=5_000, help="rows per insert (ingest's bundle)")
    parser.add_argument("--writers", type=int, default=2, help="most PostgreSQL writers at once")
    args = parser.parse_args()
    multiprocessing.set_start_method("spawn")
    print(f"{platform.node()}: {os.cpu_count()} CPUs; {args.rows:,} rows per writer in batches of {args.batch:,}")
    with tempfile.TemporaryDirectory(prefix="store-writes-") as folder:
        Path(folder).chmod(0o755)
        duck = measure(str(Path(folder) / "store.duckdb"), 1, args.rows, args.batch)
        print(f"duckdb      1 writer : {duck['rows_per_s']:>9,.0f} rows/s new, {duck['rerun_rows_per_s']:>9,.0f} rerun")
        server = LocalPostgres(Path(folder) / "pg")
        server.up(report=lambda _: None)
        os.environ["PGPASSFILE"] = str(server.pgpass)
        try:
            for writers in sorted({1, args.writers}):
                pg = measure(server.create_database(f"bench_{writers}"), writers, args.rows, args.batch)
                print(
                    f"postgresql {writers} writer{'s' if writers > 1 else ' '}: {pg['rows_per_s']:>9,.0f} rows/s new, "
                    f"{pg['rerun_rows_per_s']:>9,.0f} rerun"
                )
        finally:
            server.down(report=lambda _: None, immediate=True)


if __name__ == "__main__":
    main()
