"""The durable outbox and the agent's commits: sequence numbers, the disk bound's drop order, and crash recovery
(no Kafka here: the outbox is read directly)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeConfig
from edge_agent.outbox import Outbox
from edge_agent.scorers import load_scorer
from edge_agent.sources import FileReplay
from precursor.contracts.messages import EdgeEvent, Heartbeat, Prediction, decode

T0 = "2026-01-01T00:00:00Z"


def heartbeat(box: Outbox) -> Heartbeat:
    return Heartbeat(edge_id="e1", seq=box.next_seq(), timestamp=T0, model_name="m", model_version="1")


def prediction(box: Outbox, machine: str = "m1") -> Prediction:
    return Prediction(
        edge_id="e1",
        seq=box.next_seq(),
        machine_id=machine,
        window_start=T0,
        window_end=T0,
        horizon_h=24,
        risk={"failure": 0.5},
        model_name="m",
        model_version="1",
    )


def event(box: Outbox) -> EdgeEvent:
    return EdgeEvent(edge_id="e1", seq=box.next_seq(), timestamp=T0, machine_id="m1", event="failure:bearing")


def test_sequence_numbers_are_committed_with_the_messages_and_continue_after_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "state.db", max_bytes=10**6)
    box.stage(heartbeat(box))
    box.stage(prediction(box))
    assert box.commit() == 2
    box.stage(prediction(box))  # staged, never committed: the "agent" dies here
    box.db.close()
    again = Outbox(tmp_path / "state.db", max_bytes=10**6)
    assert again.depth == 2
    # Number 2 never left the machine, so it is given out again; 0 and 1 never are.
    assert again.next_seq() == 2


def test_only_acknowledged_messages_leave_the_outbox(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "state.db", max_bytes=10**6)
    for _ in range(5):
        box.stage(prediction(box))
    box.commit()
    reader = box.reader()
    rows = reader.pending(3)
    assert [r.seq for r in rows] == [0, 1, 2] and {r.kind for r in rows} == {"prediction"}
    assert reader.acknowledge([0, 2]) == 2
    assert box.depth == 3
    assert [r.seq for r in reader.pending(10)] == [1, 3, 4]
    assert decode(Prediction, reader.pending(1)[0].value).seq == 1
    assert reader.acknowledge([0]) == 0  # acknowledging twice removes nothing more


def test_a_full_outbox_drops_oldest_heartbeats_then_predictions_and_keeps_events(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "state.db", max_bytes=10**6)
    for _ in range(3):
        box.stage(event(box))
    for _ in range(10):
        box.stage(heartbeat(box))
    for _ in range(10):
        box.stage(prediction(box))
    box.commit()
    size = box.queued_bytes
    box.db.close()

    # Room for about half of it: every heartbeat goes, then the oldest predictions; the events stay.
    small = Outbox(tmp_path / "state.db", max_bytes=size // 2)
    small.stage(prediction(small))
    small.commit()
    kinds = [r.kind for r in small.reader().pending(100)]
    assert kinds.count("event") == 3
    assert "heartbeat" not in kinds
    assert 0 < kinds.count("prediction") < 11
    assert small.queued_bytes <= size // 2
    assert small.dropped["heartbeat"] == 10 and small.dropped["prediction"] == 11 - kinds.count("prediction")
    newest = [decode(Prediction, r.value).seq for r in small.reader().pending(100) if r.kind == "prediction"]
    assert newest == sorted(newest) and newest[-1] == 23  # what was kept is the most recent
    small.db.close()
    # The counts survive a restart.
    assert Outbox(tmp_path / "state.db", max_bytes=size).dropped["heartbeat"] == 10


def write_replay(folder: Path) -> None:
    rows = ["timestamp,machine_id,temp,vib"]
    for minute in range(0, 240, 2):
        for m in ("m1", "m2", "m3"):
            rows.append(f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z,{m},{20 + minute / 10},{minute % 7}")
    (folder / "telemetry.csv").write_text("\n".join(rows) + "\n")
    (folder / "events.csv").write_text(
        "timestamp,machine_id,event\n2026-01-01T00:31:00Z,m1,error:E7\n2026-01-01T02:00:00Z,m2,maintenance:seal\n"
    )


def edge_config(folder: Path, state: str) -> EdgeConfig:
    return EdgeConfig.from_dict(
        {
            "edge_id": "edge-o",
            "sources": [{"type": "replay", "telemetry": "telemetry.csv", "events": "events.csv", "batch_rows": 7}],
            "window": {"length": "30m", "every": "10m", "min_points": 3},
            "state_dir": state,
        },
        base=folder,
    )


def outbox_messages(state_dir: Path) -> list[Prediction | EdgeEvent]:
    box = Outbox(state_dir / "outbox.sqlite", max_bytes=10**8)
    models = {"prediction": Prediction, "event": EdgeEvent}
    return [decode(models[r.kind], r.value) for r in box.reader().pending(10**6) if r.kind in models]


def run_batches(
    config: EdgeConfig, *, commit_every: int, stop_after: int | None, snapshot_every_s: float = 1e9
) -> None:
    """One agent's life: restore, read batches from the saved position, commit every few; "die" after some."""
    box = Outbox(config.state_dir / "outbox.sqlite", max_bytes=10**8)
    agent = EdgeAgent(config, load_scorer(config.model), box)
    assert agent.checkpoint is not None
    agent.checkpoint.snapshot_every_s = snapshot_every_s
    positions = agent.restore()
    source = FileReplay(config.sources[0])
    for n, batch in enumerate(source.batches(positions.get(source.name), threading.Event()), start=1):
        agent.handle_batch(batch)
        if n % commit_every == 0:
            agent.commit()
        if stop_after is not None and n >= stop_after:
            return  # killed: whatever was handled since the last commit is lost with the process
    agent.commit()


@pytest.mark.parametrize("snapshot_every_s", [0.0, 1e9], ids=["snapshot-every-commit", "deltas-only"])
def test_a_crash_between_commits_loses_nothing_and_repeats_nothing(tmp_path: Path, snapshot_every_s: float) -> None:
    write_replay(tmp_path)
    clean = edge_config(tmp_path, "clean")
    run_batches(clean, commit_every=5, stop_after=None)
    expected = outbox_messages(clean.state_dir)

    crashy = edge_config(tmp_path, "crashy")
    run_batches(crashy, commit_every=5, stop_after=13, snapshot_every_s=snapshot_every_s)  # dies 3 batches on
    run_batches(crashy, commit_every=3, stop_after=8, snapshot_every_s=snapshot_every_s)  # restarted, dies again
    run_batches(crashy, commit_every=4, stop_after=None, snapshot_every_s=snapshot_every_s)  # and finishes
    got = outbox_messages(crashy.state_dir)

    def windows(messages: list[Prediction | EdgeEvent]) -> list[tuple[str, str, float]]:
        return sorted(
            (m.machine_id, m.window_end.isoformat(), round(m.max_risk, 9))
            for m in messages
            if isinstance(m, Prediction)
        )

    assert len(expected) > 60
    # Every window once, scored on exactly the readings a clean run saw (same risk), and every event once.
    assert windows(got) == windows(expected)
    assert sorted(e.event for e in got if isinstance(e, EdgeEvent)) == ["error:E7", "maintenance:seal"]
    seqs = [m.seq for m in got]
    assert len(seqs) == len(set(seqs))


def test_a_batch_completing_many_windows_commits_them_all_as_it_goes(tmp_path: Path) -> None:
    write_replay(tmp_path)
    config = edge_config(tmp_path, "state")
    config = config.model_copy(update={"sources": [config.sources[0].model_copy(update={"batch_rows": 10_000})]})
    box = Outbox(config.state_dir / "outbox.sqlite", max_bytes=10**8)
    agent = EdgeAgent(config, load_scorer(config.model), box, batch_size=4)
    source = FileReplay(config.sources[0])
    (batch,) = list(source.batches(None, threading.Event()))
    agent.handle_batch(batch)
    assert agent.stats.commits > 10  # committed inside the batch, four windows at a time
    agent.commit()
    predictions = [m for m in outbox_messages(config.state_dir) if isinstance(m, Prediction)]
    # Windows end every 10 minutes from 00:10 to 03:50, for three machines; every one of them is scored.
    assert len(predictions) == agent.stats.windows == agent.stats.predictions == 3 * 23
    assert len({(p.machine_id, p.window_end) for p in predictions}) == 3 * 23
