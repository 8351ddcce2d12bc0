"""The fleet load bench's books: CPU seconds per stage from /proc, and what the edges made against what the store holds.

CPU of a stage is the CPU of its processes' trees. For one tree that is, over its live members, each one's own CPU
(``utime + stime``) plus what its reaped children used (``cutime + cstime``): a child that ends moves its seconds into
its parent's ``cutime`` when reaped, so it is counted once, alive or dead. A root that dies (a killed broker) keeps
the last total seen for it; a restarted one is a new root. Seconds a member spent after the last sample before it died
are lost, so sample often (seconds).

>>> books = reconcile({"e1": 3, "e2": 2}, {"e1": StoredRows(rows=3, distinct=3), "e2": StoredRows(rows=1, distinct=1)})
>>> (books.produced, books.stored, books.lost, books.doubled, books.edges_short)
(5, 4, 1, 0, ['e2'])
>>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
2.5
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def own_and_reaped_cpu_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """``utime + stime + cutime + cstime`` of a process in seconds; None when it is gone."""
    fields = _stat_fields(pid, proc)
    if fields is None or fields[0] == "Z":  # a zombie's seconds are about to move into its parent's cutime
        return None
    # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS


def children_by_parent(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Every live process's pid under its parent's pid."""
    tree: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name), proc)
        if fields is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def tree_cpu_s(root: int, tree: Mapping[int, list[int]], proc: Path = Path("/proc")) -> float | None:
    """CPU seconds of ``root`` and all its descendants, live and reaped; None when ``root`` is gone."""
    own = own_and_reaped_cpu_s(root, proc)
    if own is None:
        return None
    total, todo = own, list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        total += own_and_reaped_cpu_s(pid, proc) or 0.0
        todo.extend(tree.get(pid, []))
    return total


@dataclass
class StageMeter:
    """CPU seconds per stage (a name) over the process trees registered under it, sampled by :meth:`sample`."""

    proc: Path = Path("/proc")
    roots: dict[str, set[int]] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    baseline: dict[int, float] = field(default_factory=dict)

    def add(self, stage: str, pid: int | None) -> None:
        """Count ``pid``'s tree under ``stage`` from now on (its CPU before now is not counted)."""
        if pid is None or pid in self.roots.get(stage, set()):
            return
        self.roots.setdefault(stage, set()).add(pid)
        now = tree_cpu_s(pid, children_by_parent(self.proc), self.proc)
        self.baseline[pid] = now or 0.0
        self.last[pid] = now or 0.0

    def sample(self) -> None:
        tree = children_by_parent(self.proc)
        for pids in self.roots.values():
            for pid in pids:
                seconds = tree_cpu_s(pid, tree, self.proc)
                if seconds is not None:
                    self.last[pid] = max(seconds, self.last.get(pid, 0.0))

    def seconds(self) -> dict[str, float]:
        """CPU seconds per stage since each of its roots was added."""
        return {stage: sum(self.last[pid] - self.baseline[pid] for pid in pids) for stage, pids in self.roots.items()}


@dataclass(frozen=True)
class StoredRows:
    """One edge's predictions in the store: rows, and distinct (machine, window end) among them."""

    rows: int
    distinct: int


@dataclass(frozen=True)
class Books:
    """The edges' own count of predictions made against the store's, over the fleet."""

    produced: int
    stored: int
    lost: int
    doubled: int
    edges_short: list[str]
    edges_over: list[str]


def reconcile(produced: Mapping[str, int], stored: Mapping[str, StoredRows]) -> Books:
    """Per edge: a prediction the edge counted but the store lacks is lost; a row beyond one per (machine, window)
    is doubled (the key ``(edge_id, seq)`` cannot double, a prediction made twice under two seqs could)."""
    lost = doubled = 0
    short, over = [], []
    for edge in sorted(set(produced) | set(stored)):
        made = produced.get(edge, 0)
        rows = stored.get(edge, StoredRows(0, 0))
        doubled += rows.rows - rows.distinct
        if rows.distinct < made:
            lost += made - rows.distinct
            short.append(edge)
        elif rows.rows > made:
            over.append(edge)
    return Books(
        produced=sum(produced.values()),
        stored=sum(r.rows for r in stored.values()),
        lost=lost,
        doubled=doubled,
        edges_short=short,
        edges_over=over,
    )


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
