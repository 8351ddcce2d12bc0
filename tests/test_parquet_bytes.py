"""Parquet read from bytes leaves nothing for Arrow's IO threads to release while the interpreter exits.

Reading ``pa.BufferReader(bytes)`` directly made a process that had finished its work abort at exit now and then
("terminate called without an active exception", SIGABRT): CI's `precursor pipeline label` did. The race is at process
exit, so each read runs in a fresh process of its own, counted.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from precursor.contracts.parquet import read_parquet_bytes
from tests.conftest import REPO_ROOT

PROCESSES = 30  # reading from the bytes themselves, each of 3 runs of this test saw an abort among its 30

READ_AND_EXIT = """
import sys
from precursor.contracts.parquet import read_parquet_bytes
data = open(sys.argv[1], "rb").read()
for _ in range(4):
    table = read_parquet_bytes(data)
assert table.num_rows == int(sys.argv[2])
"""


def a_day_file(path: Path, rows: int = 2_000) -> Path:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    table = pa.table(
        {
            "machine_id": [f"pump-{i % 17:02d}" for i in range(rows)],
            "window_end": [start + timedelta(minutes=i) for i in range(rows)],
            "risk": [i / rows for i in range(rows)],
            "outcome": ["ok" if i % 11 else "bearing" for i in range(rows)],
        }
    )
    pq.write_table(table, path)
    return path


def test_the_table_is_the_files_and_keeps_no_reference_to_the_bytes(tmp_path: Path) -> None:
    path = a_day_file(tmp_path / "day.parquet")
    data = path.read_bytes()
    table = read_parquet_bytes(data, pq.read_schema(path))
    assert table.equals(pq.read_table(path))
    del data  # the table's buffers are Arrow's own: it outlives the bytes it was read from
    assert table.column("outcome").to_pylist()[:2] == ["bearing", "ok"]


def test_processes_that_read_parquet_from_bytes_all_exit_cleanly(tmp_path: Path) -> None:
    path = a_day_file(tmp_path / "day.parquet")

    def run(_: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", READ_AND_EXIT, str(path), "2000"]
        return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(run, range(PROCESSES)))
    failed = [(d.returncode, d.stderr.strip()[-200:]) for d in done if d.returncode != 0]
    assert failed == [], f"{len(failed)} of {PROCESSES} processes failed: {failed[:3]}"
