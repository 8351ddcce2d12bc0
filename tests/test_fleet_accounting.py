"""The fleet load bench's books (bench/fleet_accounting.py): CPU per process tree counted once, alive or reaped, and
the edges' counts against the store's rows."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _books() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_accounting", REPO / "bench" / "fleet_accounting.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


books = _books()

BURN_S = 0.6
# A root that starts a child which burns BURN_S of CPU, reaps it, says so, and waits to be told to go.
ROOT = f"""
import subprocess, sys
child = "import time\\nend = time.process_time() + {BURN_S}\\nwhile time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", child], check=True)
print("reaped", flush=True)
sys.stdin.readline()
"""


def test_a_childs_cpu_counts_once_whether_it_runs_or_was_reaped() -> None:
    meter = books.StageMeter()
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        meter.add("stage", root.pid)
        seen_running = 0.0
        deadline = time.monotonic() + 60
        while root.stdout is not None and time.monotonic() < deadline:
            meter.sample()
            seen_running = max(seen_running, meter.seconds()["stage"])
            if root.poll() is not None:
                break
            time.sleep(0.05)
            if seen_running >= BURN_S / 2:
                break
        assert root.stdout is not None and root.stdout.readline().strip() == "reaped"
        meter.sample()
        after = meter.seconds()["stage"]
        # The child was seen while it ran, and once reaped its seconds moved into the root's cutime: not twice.
        assert seen_running >= BURN_S / 2
        assert BURN_S <= after < 2 * BURN_S
        assert root.stdin is not None
        root.stdin.write("go\n")
        root.stdin.flush()
        root.wait(30)
        meter.sample()  # the root is gone: it keeps its last total
        assert meter.seconds()["stage"] == after
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(10)


def test_the_books_find_lost_and_doubled_predictions_per_edge() -> None:
    stored = {
        "edge-000": books.StoredRows(rows=10, distinct=10),
        "edge-001": books.StoredRows(rows=9, distinct=8),  # a window stored twice under two seqs
        "edge-002": books.StoredRows(rows=4, distinct=4),
    }
    result = books.reconcile({"edge-000": 10, "edge-001": 8, "edge-002": 5, "edge-003": 1}, stored)
    assert (result.produced, result.stored) == (24, 23)
    assert (result.lost, result.doubled) == (2, 1)
    assert result.edges_short == ["edge-002", "edge-003"]
    assert result.edges_over == ["edge-001"]


def test_percentile_interpolates_between_ranks() -> None:
    assert books.percentile([3.0, 1.0, 2.0], 0.95) == 2.9
    assert books.percentile([5.0], 0.95) == 5.0
