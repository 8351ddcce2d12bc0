"""Exact accounting under faults: the edge agent daemon, a real process replaying a file with bad rows among good
ones into the real Kafka broker, killed at random points (SIGKILL and SIGTERM, a paced and an unpaced replay) and
started again until the replay is done. Then every row is accounted for exactly once:

- every good reading was accepted by the window builder once (the count committed with the positions), and every
  window was scored once, with the same readings as an uninterrupted run (the same risk, in the prediction store);
- every bad row is in the quarantine once (the file and the committed counts).

Random points come from a seeded generator, so a failure reproduces; the seed is in the assertion messages.
Also here: a source that fails (rather than a record) makes the daemon exit with status 1, not 0.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from edge_agent.agent import EdgeAgent
from edge_agent.checkpoint import readings_accepted
from edge_agent.config import EdgeConfig
from edge_agent.quarantine import Quarantine
from edge_agent.scorers import load_scorer
from edge_agent.sources import FileReplay
from pipelines.run import run_once
from precursor.contracts.messages import Prediction
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.test_edge_agent import ListSink

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SEED = 20261202
T0 = 1767225600  # 2026-01-01, in the edge's past
STEP_S = 10
MAX_RECORD_BYTES = 1024


def bad_row(kind: int, t: int, machine: str) -> bytes:
    """A row the agent must quarantine: each a way a row was seen to go wrong, or to stop a source before. Its time
    is between two steps, so a bad row let through would be one accepted reading too many."""
    t += STEP_S // 2
    rows = [
        f"{t},{machine},NaN,1",
        f"{t},{machine},1e308,1",  # finite in float64, inf in the float32 window
        f"{t},{machine},hot,1",
        f"{t},{machine} 9,1,1",
        f"{'9' * 400},{machine},1,1",  # OverflowError out of the parser, once
        f"{t},{machine},{'7' * 5000},1",  # longer than max_record_bytes
        f'{t},{machine},"1"x,1',  # quoted, then more
        f"{t},{machine},1",
        f"{t + 60 * 365 * 86400},{machine},1,1",  # sixty years ahead: quarantined by the agent, not waited for
    ]
    if kind == len(rows):
        return f"{t},m\xe9,1,1".encode("latin-1")  # not UTF-8
    return rows[kind].encode()


@dataclass
class Replay:
    path: Path
    good: int
    bad_sources: Counter[str]  # what the quarantine names each bad row by: "path:line", or the machine (future rows)


def write_replay(path: Path, machines: int, steps: int, rng: random.Random) -> Replay:
    lines = [b"timestamp,machine_id,temp,vib"]
    good = 0
    bad: Counter[str] = Counter()
    for k in range(steps):
        t = T0 + STEP_S * k
        for m in range(machines):
            machine = f"k-{m}"
            if rng.random() < 0.03:
                kind = rng.randrange(10)
                lines.append(bad_row(kind, t, machine))
                bad[machine if kind == 8 else f"{path}:{len(lines)}"] += 1
            lines.append(f"{t},{machine},{rng.gauss(20, 2) + k / 50:.4f},{rng.random():.4f}".encode())
            good += 1
    path.write_bytes(b"\n".join(lines) + b"\n")
    return Replay(path, good, bad)


def edge_config(tmp: Path, edge_id: str, replay: Replay, kafka: KafkaSettings, speedup: float) -> dict[str, object]:
    return {
        "edge_id": edge_id,
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topic_prefix": kafka.topic_prefix},
        "sources": [{"type": "replay", "telemetry": str(replay.path), "speedup": speedup, "batch_rows": 64}],
        "window": {"length": "2m", "every": "1m", "min_points": 3},
        "input": {"max_record_bytes": MAX_RECORD_BYTES},
        "health": {"enabled": False},
        "updates": {"enabled": False},
        "exit_when_sources_end": True,
        "state_dir": str(tmp / "state"),
    }


def reference_predictions(config: dict[str, object], tmp: Path) -> dict[tuple[str, int], float]:
    """What an uninterrupted agent predicts over the same replay, in process."""
    cfg = EdgeConfig.from_dict(config | {"state_dir": str(tmp / "reference")})
    sink = ListSink()
    agent = EdgeAgent(cfg, load_scorer(cfg.model), sink)
    agent.run(FileReplay(cfg.sources[0]))  # type: ignore[arg-type]
    agent.close()
    found = [m for m in sink.messages if isinstance(m, Prediction)]
    return {(p.machine_id, int(p.window_end.timestamp())): p.max_risk for p in found}


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "edge_agent.daemon", "--config", str(config)],
            stdout=out,
            stderr=out,
            env=os.environ | {"PYTHONPATH": str(REPO)},
        )


def replayed_items(state: Path) -> int:
    """The replay's committed position (items handed on), read as another process would."""
    db = state / "outbox.sqlite"
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = con.execute("SELECT position FROM positions").fetchone()
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()
    return 0 if row is None else int(json.loads(row[0])["items"])


def wait_progress(agent: subprocess.Popen[bytes], state: Path, seen: int, timeout_s: float = 30) -> None:
    """Until the agent committed a position past ``seen`` (or exited)."""
    deadline = time.monotonic() + timeout_s
    while replayed_items(state) <= seen and agent.poll() is None:
        assert time.monotonic() < deadline, f"no progress past {seen} items within {timeout_s} s"
        time.sleep(0.01)


@dataclass
class Tally:
    scenario: str
    kills: int  # signals that found the agent still running
    rows: int
    good: int
    bad: int
    accepted: int = 0
    quarantined: int = 0
    quarantine_lines: int = 0
    windows: int = 0
    reference_windows: int = 0
    missing_windows: int = 0
    doubled_windows: int = 0
    changed_windows: int = 0
    missing_quarantined: int = 0
    doubled_quarantined: int = 0


def stored(store: Path, edge_id: str) -> list[tuple[str, int, float]]:
    with connect(store, read_only=True) as con:
        return con.execute(
            "SELECT machine_id, CAST(epoch(window_end) AS BIGINT), max_risk FROM predictions WHERE edge_id = ?",
            [edge_id],
        ).fetchall()


SCENARIOS = [  # (signal, paced, kills)
    (signal.SIGKILL, False, 3),
    (signal.SIGKILL, True, 3),
    (signal.SIGTERM, False, 3),
    (signal.SIGTERM, True, 3),
]


Run = tuple[Path, Replay, dict[str, object], Tally]


def kill_and_restart(n: int, sig: signal.Signals, paced: bool, kills: int, root: Path, kafka: KafkaSettings) -> Run:
    """One scenario: ``kills`` runs stopped by ``sig`` at a random point after some progress, then one to the end."""
    rng = random.Random(SEED + n)
    name = f"{sig.name.lower()}-{'paced' if paced else 'unpaced'}"
    tmp = root / name
    tmp.mkdir()
    # Unpaced: enough rows that the replay takes about a second. Paced: an hour of event time in 2 s.
    replay = write_replay(tmp / "telemetry.csv", 6 if not paced else 4, 2000 if not paced else 360, rng)
    config = edge_config(tmp, f"edge-kill-{name}", replay, kafka, 1800.0 if paced else 0.0)
    (tmp / "edge.yaml").write_text(yaml.safe_dump(config))
    tally = Tally(name, 0, replay.good + replay.bad_sources.total(), replay.good, replay.bad_sources.total())
    log = tmp / "agent.log"
    seen = 0
    for _ in range(kills):
        agent = start(tmp / "edge.yaml", log)
        try:
            wait_progress(agent, tmp / "state", seen)
            time.sleep(rng.uniform(0.0, 1.2 if paced else 0.3))
            if agent.poll() is None:
                agent.send_signal(sig)
                tally.kills += 1
            code = agent.wait(30)
        finally:
            if agent.poll() is None:
                agent.kill()
        assert code in (0, -signal.SIGKILL), f"{name}, seed {SEED}: exit {code}\n{log.read_text()[-3000:]}"
        seen = replayed_items(tmp / "state")
    agent = start(tmp / "edge.yaml", log)  # the last run replays to the end and exits
    assert agent.wait(60) == 0, f"{name}, seed {SEED}:\n{log.read_text()[-3000:]}"
    return tmp, replay, config, tally


def test_killed_and_restarted_at_random_points_every_row_is_scored_or_quarantined_exactly_once(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    # The scenarios run side by side: most of a run is a process starting, which waits more than it computes.
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        runs = list(
            pool.map(
                lambda args: kill_and_restart(*args, root=tmp_path, kafka=kafka_settings),
                [(n, *scenario) for n, scenario in enumerate(SCENARIOS)],
            )
        )
    tallies = [tally for *_, tally in runs]

    store = tmp_path / "store.duckdb"
    run_once(kafka_settings, store)
    failures = []
    for tmp, replay, config, tally in runs:
        state = sqlite3.connect(tmp / "state" / "outbox.sqlite")
        tally.accepted = readings_accepted(state)
        tally.quarantined = sum(Quarantine.saved(state).values())
        state.close()
        entries = [json.loads(line) for line in (tmp / "state" / "quarantine.jsonl").read_text().splitlines()]
        tally.quarantine_lines = len(entries)
        quarantined = Counter(e["source"] for e in entries)
        tally.missing_quarantined = (replay.bad_sources - quarantined).total()
        tally.doubled_quarantined = (quarantined - replay.bad_sources).total()

        reference = reference_predictions(config, tmp)
        rows = stored(store, str(config["edge_id"]))
        windows = Counter((m, end) for m, end, _ in rows)
        tally.windows = len(rows)
        tally.reference_windows = len(reference)
        tally.missing_windows = len(reference.keys() - windows.keys())
        tally.doubled_windows = sum(n - 1 for n in windows.values())
        tally.changed_windows = sum(1 for m, end, risk in rows if (m, end) in reference and reference[m, end] != risk)
        lost_or_doubled = (
            tally.accepted != tally.good
            or tally.quarantined != tally.bad
            or tally.quarantine_lines != tally.bad
            or tally.missing_quarantined
            or tally.doubled_quarantined
            or tally.missing_windows
            or tally.doubled_windows
            or tally.changed_windows
            or tally.windows != tally.reference_windows
        )
        if lost_or_doubled:
            failures.append(tally)
    print("\n" + "\n".join(map(str, tallies)))
    assert all(t.kills >= 1 for t in tallies), f"seed {SEED}: a scenario was never killed mid-run: {tallies}"
    assert all(t.reference_windows > 100 for t in tallies)
    assert not failures, f"seed {SEED}: {failures}"


def test_a_source_that_fails_makes_the_daemon_exit_with_status_1_naming_it(tmp_path: Path) -> None:
    """A bad record is quarantined; a source that cannot go on (here a file that is not Parquet at all) stops the
    agent with status 1, so its supervisor restarts it and nobody mistakes it for a replay that ended (status 0)."""
    (tmp_path / "telemetry.parquet").write_bytes(b"this is not a parquet file\n" * 10)
    config = {
        "edge_id": "edge-dead-source",
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "sources": [{"type": "replay", "telemetry": "telemetry.parquet"}],
        "health": {"enabled": False},
        "updates": {"enabled": False},
        "drain_timeout": "0s",
        "state_dir": "state",
    }
    (tmp_path / "edge.yaml").write_text(yaml.safe_dump(config))
    with tempfile.TemporaryFile() as out:
        code = subprocess.run(
            [sys.executable, "-m", "edge_agent.daemon", "--config", "edge.yaml"],
            cwd=tmp_path,
            stdout=out,
            stderr=out,
            env=os.environ | {"PYTHONPATH": str(REPO)},
            timeout=60,
        ).returncode
        out.seek(0)
        said = out.read().decode(errors="replace")
    assert code == 1, said[-3000:]
    assert "error: source replay:" in said and "telemetry.parquet failed: ArrowInvalid" in said, said[-3000:]
