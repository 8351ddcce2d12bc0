"""Property: whatever malformed records arrive, and wherever they fall among good ones, the agent keeps running,
quarantines each one with a reason, and the good readings give exactly the predictions they give alone."""

from __future__ import annotations

import functools
import json
import sqlite3
import string
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent.agent import EdgeAgent
from edge_agent.checkpoint import readings_accepted
from edge_agent.config import EdgeConfig
from edge_agent.outbox import Outbox
from edge_agent.parsing import RecordParser
from edge_agent.quarantine import Quarantine
from edge_agent.scorers import load_scorer
from edge_agent.statedb import open_state_db
from edge_agent.telemetry_source import SourceBatch
from precursor.contracts.messages import Prediction, decode

GOOD = ("good-1", "good-2")
T0 = 1_767_225_600
CSV_HEADER = ["timestamp", "machine_id", "temp", "vib"]
IDENTIFIER_CHARS = string.ascii_letters + string.digits + "_.:-"


def good_lines() -> list[tuple[str, str]]:
    lines = []
    for k in range(36):
        for m in GOOD:
            lines.append(("json", json.dumps({"timestamp": T0 + 300 * k, "machine_id": m, "temp": k % 7, "vib": 0.5})))
    return lines


def record(**fields: object) -> dict[str, object]:
    return {"timestamp": T0 + 60, "machine_id": "good-1", "temp": 1.0} | fields


def unparseable_timestamp(text: str) -> bool:
    try:
        RecordParser("x").timestamp(text)
    except ValueError:
        return True
    return False


bad_values = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 10**400]),
)
bad_json_objects = st.one_of(
    bad_values.map(lambda v: record(temp=v)),
    st.text(IDENTIFIER_CHARS, min_size=1, max_size=20)
    .filter(lambda m: m not in GOOD and m[0].isalnum())
    .map(lambda m: record(machine_id=m)),  # unknown machines
    st.integers(2, 80 * 365).map(lambda days: record(timestamp=time.time() + days * 86400)),  # far in the future
    st.text(max_size=30)
    .filter(lambda m: not (m and m[0].isalnum() and set(m) <= set(IDENTIFIER_CHARS)))
    .map(lambda m: record(machine_id=m)),
    st.one_of(
        st.text(string.ascii_letters + " :-", min_size=1, max_size=20).filter(unparseable_timestamp),
        st.sampled_from([-1, 1e12, True, None, [], {}]),
    ).map(lambda t: record(timestamp=t)),
    st.sampled_from(["timestamp", "machine_id"]).map(lambda k: {k2: v for k2, v in record().items() if k2 != k}),
    st.just({"timestamp": T0, "machine_id": "good-1"}),
    st.sampled_from(["explode", "failure:", "error:E 7", ""]).map(
        lambda e: {"timestamp": T0, "machine_id": "good-1", "event": e or 5}
    ),
)
bad_records = st.one_of(
    bad_json_objects.map(lambda obj: ("json", json.dumps(obj))),
    st.text(max_size=120).filter(lambda s: not s.strip().startswith("[")).map(lambda s: ("json", s)),
    st.lists(st.text(',\n\r"', max_size=8), min_size=1, max_size=6)
    .filter(lambda fs: len(fs) != len(CSV_HEADER))
    .map(lambda fs: ("csv", ",".join(fs))),
    st.tuples(st.sampled_from(["hot", "NaN", "inf", "1e999", "--1"]), st.booleans()).map(
        lambda v: ("csv", f"{T0},good-1,{v[0]},1" if v[1] else f"{T0},good-1,1,{v[0]}")
    ),
)


def new_agent(state: Path, batch_size: int = 16) -> EdgeAgent:
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-p",
            "sources": [{"type": "tail", "path": "unused.jsonl"}],
            "window": {"length": "30m", "every": "15m", "min_points": 2},
            "machines": {"allow": list(GOOD)},
            "state_dir": str(state),
        }
    )
    outbox = Outbox(state / "outbox.sqlite", max_bytes=10**8)
    return EdgeAgent(config, load_scorer(config.model), outbox, batch_size=batch_size)


def feed(agent: EdgeAgent, lines: list[tuple[str, str]]) -> None:
    parser = RecordParser("gen")
    layout = parser.csv_layout(CSV_HEADER)
    for n, (fmt, text) in enumerate(lines, start=1):
        records = parser.json_line(text, n) if fmt == "json" else [parser.csv_row(layout, text.split(","), n, text)]
        for r in records:
            agent.handle(r)
    agent.commit()


def predictions(agent: EdgeAgent) -> list[tuple[str, str, float]]:
    assert agent.outbox is not None
    rows = agent.outbox.reader().pending(10**6)
    found = [decode(Prediction, r.value) for r in rows if r.kind == "prediction"]
    return sorted((p.machine_id, p.window_end.isoformat(), p.max_risk) for p in found)


@functools.cache
def baseline() -> list[tuple[str, str, float]]:
    """The predictions of the good readings alone (computed once)."""
    with tempfile.TemporaryDirectory() as state:
        agent = new_agent(Path(state))
        feed(agent, good_lines())
        return predictions(agent)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(bad=st.lists(bad_records, min_size=20, max_size=150), data=st.data())
def test_malformed_records_are_each_quarantined_with_a_reason_and_good_readings_are_untouched(
    bad: list[tuple[str, str]], data: st.DataObject
) -> None:
    good = good_lines()
    slots = sorted(data.draw(st.lists(st.integers(0, len(good)), min_size=len(bad), max_size=len(bad))))
    mixed: list[tuple[str, str]] = []
    previous = 0
    for slot, record_ in zip(slots, bad, strict=True):
        mixed += [*good[previous:slot], record_]
        previous = slot
    mixed += good[previous:]

    with tempfile.TemporaryDirectory() as state:
        agent = new_agent(Path(state))
        feed(agent, mixed)
        agent.close()
        entries = [json.loads(line) for line in (Path(state) / "quarantine.jsonl").read_text().splitlines()]
        assert agent.stats.quarantined == len(bad) == len(entries)
        assert all(e["reason"] and e["kind"] for e in entries)
        assert predictions(agent) == baseline()


def test_the_baseline_has_predictions_for_both_machines() -> None:
    assert len(baseline()) >= 2 * 10
    assert {m for m, _, _ in baseline()} == set(GOOD)
    assert datetime.fromisoformat(baseline()[0][1]) > datetime.fromtimestamp(T0, UTC)


# --- exactly once across a crash ---------------------------------------------------------------------------------


def committed(db: sqlite3.Connection, quarantine: Quarantine) -> None:
    db.execute("BEGIN IMMEDIATE")
    quarantine.write(db)
    db.execute("COMMIT")
    quarantine.committed()


def killed_mid_commit(db: sqlite3.Connection, quarantine: Quarantine) -> None:
    """What a process killed after writing the file, before its transaction committed, leaves behind."""
    db.execute("BEGIN IMMEDIATE")
    quarantine.write(db)
    db.execute("ROLLBACK")
    quarantine.close()


def test_lines_written_past_the_last_commit_are_cut_off_at_the_next_start(tmp_path: Path) -> None:
    db = open_state_db(tmp_path / "state.sqlite")
    path = tmp_path / "quarantine.jsonl"
    first = Quarantine(path, max_bytes=600)
    first.recover(db)
    first.put("a.csv:2", "x", "not valid JSON: Expecting value")
    committed(db, first)
    for n in range(3, 8):  # past max_bytes: the file rotates inside the commit that never happens
        first.put(f"a.csv:{n}", "x" * 40, "sensor t='x' is not a number")
    killed_mid_commit(db, first)
    assert path.with_name("quarantine.jsonl.1").exists()

    again = Quarantine(path, max_bytes=600)
    again.recover(db)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["source"] for e in lines] == ["a.csv:2"]
    assert again.counts == {"malformed": 1} and Quarantine.saved(db) == {"malformed": 1}
    again.put("a.csv:3", "x", "sensor t='x' is not a number")
    committed(db, again)
    assert [json.loads(line)["source"] for line in path.read_text().splitlines()] == ["a.csv:2", "a.csv:3"]
    assert Quarantine.saved(db) == {"malformed": 1, "wrong_type": 1}


def test_a_batch_read_again_after_a_crash_is_quarantined_once_though_a_commit_came_mid_batch(tmp_path: Path) -> None:
    """A burst of windows commits in the middle of a batch, without the batch's position; the crash comes before the
    batch's own commit: the batch is read again. Its bad records are in the file once, and every reading is counted
    as accepted once."""
    parser = RecordParser("t.jsonl")
    items = []
    for k in range(24):
        items += parser.json_line(json.dumps({"timestamp": T0 + 300 * k, "machine_id": "good-1", "temp": k}), k)
        items += parser.json_line(f'{{"timestamp": {T0 + 300 * k}, "machine_id": "good-1", "temp": "hot"}}', 100 + k)
    batch = SourceBatch("t", items, position=json.dumps({"items": len(items)}))

    state = tmp_path / "state"
    agent = new_agent(state, batch_size=1)  # every window commits at once: commits inside the batch
    agent.restore()
    agent.handle_batch(batch)
    assert agent.stats.commits > 3
    agent.outbox.db.close()  # type: ignore[union-attr]  # killed: no commit after the batch
    agent.quarantine.close()

    again = new_agent(state, batch_size=1)
    positions = again.restore()
    assert positions == {}  # the batch's position was never committed
    again.handle_batch(batch)
    again.commit()
    entries = [json.loads(line)["source"] for line in (state / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(entries) == sorted(f"t.jsonl:{100 + k}" for k in range(24))
    assert readings_accepted(again.outbox.db) == 24  # type: ignore[union-attr]
    assert Quarantine.saved(again.outbox.db) == {"wrong_type": 24}  # type: ignore[union-attr]
