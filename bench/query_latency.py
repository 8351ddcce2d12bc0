"""Latency of the two questions asked most (at risk now; one machine's history) over a store of 10 million predictions.

Builds the store once (``--store``, default ``bench/query-10m.duckdb`` in the state folder, ``PRECURSOR_STATE_DIR``
or ``.state``; rebuilt when its row count differs):
1,000 machines on 20 edges, one prediction per machine every 10 minutes for ~69 days, appended in time order as the
pipeline appends them, with ``latest_predictions`` kept as the writer keeps it. Then it asks each question
``--rounds`` times: the way the API's reader does (attach the file read-only to a long-lived in-memory DuckDB, ask,
detach), the way a one-shot ``precursor query`` does (a new DuckDB instance per question), and through the HTTP API
(a uvicorn server in this process, over loopback), and prints p50 / p95 / max in milliseconds. With ``--upsert`` it also
times one 5,000-row ingest batch with and without the ``latest_predictions`` upsert.

    .venv/bin/python bench/query_latency.py                 # 10 M rows (first run builds the store: a few minutes)
    .venv/bin/python bench/query_latency.py --rows 1000000  # a quicker look
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from pipelines.ingest import prediction_batch  # noqa: E402
from pipelines.records import prediction_record  # noqa: E402
from precursor.api.app import create_app  # noqa: E402
from precursor.api.settings import ApiSettings  # noqa: E402
from precursor.contracts.messages import Prediction  # noqa: E402
from precursor.contracts.settings import KafkaSettings  # noqa: E402
from precursor.store.db import LATEST_PREDICTIONS_UPSERT, SCHEMA, connect  # noqa: E402
from precursor.store.queries import StoreAttacher, StoreReader, reading  # noqa: E402
from tests.fixtures_api import serving  # noqa: E402

MACHINES = 1000
EDGES = 20
TOKEN = "bench-token-0123456789abcdef"


def build_store(path: Path, rows: int) -> None:
    """``rows`` predictions in time order (the order the pipeline appends them), plus events and the latest table."""
    per_machine = rows // MACHINES
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    with duckdb.connect(str(path)) as con:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(SCHEMA)
        # Risk drifts per machine (a slow sine plus noise) so a few machines sit above the threshold at any time.
        con.execute(
            f"""
            INSERT INTO predictions
            SELECT 'edge-' || lpad((m % {EDGES})::VARCHAR, 3, '0') AS edge_id,
                   i * {MACHINES} + m AS seq,
                   'm-' || lpad(m::VARCHAR, 5, '0') AS machine_id,
                   TIMESTAMPTZ '2026-01-01 00:00:00+00' + to_minutes(i * 10) AS window_start,
                   TIMESTAMPTZ '2026-01-01 06:00:00+00' + to_minutes(i * 10) AS window_end,
                   24.0 AS horizon_h,
                   json_object('bearing', round(r, 4), 'clog', round(r * 0.5, 4)) AS risk,
                   round(r, 4) AS max_risk,
                   'bearing' AS top_kind,
                   'precursor-lm' AS model_name,
                   CASE WHEN i < {per_machine} * 2 / 3 OR m % 3 = 0 THEN '0.1.0' ELSE '0.2.0' END AS model_version,
                   TIMESTAMPTZ '2026-01-01 06:00:05+00' + to_minutes(i * 10) AS emitted_at,
                   TIMESTAMPTZ '2026-01-01 06:00:10+00' + to_minutes(i * 10) AS ingested_at
            FROM (
                SELECT i, m,
                       least(1.0, greatest(0.0, 0.25 + 0.35 * sin(i / 300.0 + m) * sin(m * 7.0) + 0.05 * random())) AS r
                FROM range({per_machine}) t(i), range({MACHINES}) u(m)
            )
            ORDER BY i, m
            """
        )
        con.execute(
            """
            INSERT INTO events
            SELECT edge_id, seq + 5000000000, machine_id, window_end + INTERVAL 3 HOUR, 'failure:bearing', 'failure',
                   'bearing', ingested_at
            FROM predictions WHERE seq % 9973 = 0
            """
        )
        con.execute("CREATE TEMP VIEW incoming AS SELECT * FROM predictions")
        con.execute(LATEST_PREDICTIONS_UPSERT)
        con.execute("CHECKPOINT")
    print(f"built {rows:,} predictions in {time.perf_counter() - started:.0f} s -> {path}")


def stored_rows(path: Path) -> int:
    if not path.exists():
        return -1
    try:
        with connect(path, read_only=True) as con:
            return int(con.execute("SELECT count(*) FROM predictions").fetchone()[0])  # type: ignore[index]
    except duckdb.Error:
        return -1


def timings(ask: Callable[[], object], rounds: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        ask()
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        ask()
        out.append((time.perf_counter() - started) * 1000)
    return out


def summary(name: str, ms: list[float]) -> str:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{name:<34} p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms   max {ordered[-1]:7.1f} ms"


def upsert_cost(path: Path, batch_rows: int = 5000) -> tuple[float, float]:
    """Seconds for one ingest batch into a copy of the store: the plain insert, and insert plus the upsert."""
    with tempfile.TemporaryDirectory(prefix="precursor-bench-") as scratch:
        copy = Path(scratch) / "copy.duckdb"
        shutil.copy(path, copy)
        now = datetime.now(UTC)
        start = datetime(2026, 6, 1, tzinfo=UTC)

        def batch(offset: int) -> pa.Table:
            rows = []
            for k in range(batch_rows):
                machine = f"m-{k % MACHINES:05d}"
                end = start + timedelta(minutes=10 * (offset + k // MACHINES))
                p = Prediction(
                    edge_id="edge-bench",
                    seq=offset * batch_rows + k,
                    machine_id=machine,
                    window_start=end - timedelta(hours=6),
                    window_end=end,
                    horizon_h=24,
                    risk={"bearing": random.random()},
                    model_name="precursor-lm",
                    model_version="0.3.0",
                )
                rows.append(tuple(prediction_record(p, partition=0, offset=k)))
            return prediction_batch(rows, now)

        seconds: dict[bool, list[float]] = {False: [], True: []}
        for offset in range(8):  # alternate, so neither side gets the cold first connection
            with_upsert = offset % 2 == 1
            incoming = batch(offset * 10)
            columns = ", ".join(incoming.column_names)
            started = time.perf_counter()
            with connect(copy) as con:
                con.register("incoming", incoming)
                con.execute(f"INSERT INTO predictions ({columns}) SELECT {columns} FROM incoming")
                if with_upsert:
                    con.execute(LATEST_PREDICTIONS_UPSERT)
            seconds[with_upsert].append(time.perf_counter() - started)
        return statistics.median(seconds[False][1:]), statistics.median(seconds[True][1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    state = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    parser.add_argument("--store", type=Path, default=state / "bench" / "query-10m.duckdb")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--upsert", action="store_true", help="also time an ingest batch with and without the upsert")
    args = parser.parse_args(argv)
    if args.rows != 10_000_000 and args.store.name == "query-10m.duckdb":
        args.store = args.store.with_name(f"query-{args.rows}.duckdb")
    if stored_rows(args.store) != args.rows // MACHINES * MACHINES:
        build_store(args.store, args.rows)
    size_mib = args.store.stat().st_size / 2**20
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"store {args.store} ({stored_rows(args.store):,} predictions, {size_mib:.0f} MiB); {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), load average {load:.1f}; {args.rounds} rounds each"
    )
    machines = [f"m-{i:05d}" for i in range(MACHINES)]
    rng = random.Random(7)

    attacher = StoreAttacher(args.store)

    def at_risk(one_shot: bool) -> Callable[[], object]:
        def ask() -> object:
            with reading(args.store) if one_shot else attacher.reading() as store:
                return store.at_risk(limit=50)

        return ask

    def history(one_shot: bool) -> Callable[[], object]:
        def ask() -> object:
            with reading(args.store) if one_shot else attacher.reading() as store:
                return store.machine_history(rng.choice(machines), limit=100)

        return ask

    print(summary("at risk, API reader (top 50)", timings(at_risk(False), args.rounds)))
    print(summary("history, API reader (100 rows)", timings(history(False), args.rounds)))
    print(summary("at risk, one-shot (CLI)", timings(at_risk(True), args.rounds)))

    def at_risk_derived() -> object:
        with attacher.reading() as store:
            return StoreReader(store.con, use_latest_table=False).at_risk(limit=50)

    print(summary("at risk without latest table", timings(at_risk_derived, max(3, args.rounds // 10), warmup=1)))
    print(summary("history, one-shot (CLI)", timings(history(True), args.rounds)))
    attacher.close()

    app = create_app(ApiSettings(tokens=TOKEN, store=args.store), KafkaSettings())
    with serving(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as http:

        def http_at_risk() -> object:
            response = http.get("/api/v1/machines/at-risk", params={"limit": 50})
            response.raise_for_status()
            return response

        def http_history() -> object:
            response = http.get(f"/api/v1/machines/{rng.choice(machines)}/predictions", params={"limit": 100})
            response.raise_for_status()
            return response

        print(summary("GET /machines/at-risk (HTTP)", timings(http_at_risk, args.rounds)))
        print(summary("GET /machines/{id}/predictions", timings(http_history, args.rounds)))
    if args.upsert:
        plain, with_upsert = upsert_cost(args.store)
        ms = plain * 1000, with_upsert * 1000
        print(f"ingest batch of 5,000 rows (median): insert {ms[0]:.0f} ms; insert + latest upsert {ms[1]:.0f} ms")


if __name__ == "__main__":
    main()
