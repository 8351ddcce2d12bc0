"""The edge agent with a list as its sink (a fake of our own interface: unit tests only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.config import ConfigError, EdgeConfig
from edge_agent.scorers import load_scorer
from edge_agent.sources import FileReplay
from precursor.contracts.messages import EdgeEvent, Prediction


class ListSink:
    def __init__(self) -> None:
        self.messages: list[object] = []
        self.flushes = 0

    def send(self, message: object) -> None:
        self.messages.append(message)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


def write_fleet(folder: Path) -> None:
    rows = ["timestamp,machine_id,temp,vib"]
    for m in ("m1", "m2"):
        for minute in range(0, 120, 5):
            rows.append(f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z,{m},{20 + minute / 10},{minute / 100}")
    rows.insert(5, "2026-01-01T00:20:00Z,m1,NaNx,1")  # a bad row among good ones
    rows.insert(9, "2126-01-01T00:00:00Z,m1,1,1")  # a clock a century ahead
    (folder / "telemetry.csv").write_text("\n".join(rows) + "\n")
    (folder / "events.csv").write_text(
        "timestamp,machine_id,event\n2026-01-01T00:30:00Z,m1,error:E7\n2026-01-01T01:00:00Z,m2,explode\n"
        "2026-01-01T03:00:00Z,m1,failure:bearing\n"
    )


def config(folder: Path, **overrides: object) -> EdgeConfig:
    data = {
        "edge_id": "edge-t",
        "sources": [{"type": "replay", "telemetry": "telemetry.csv", "events": "events.csv"}],
        "window": {"length": "30m", "every": "15m", "min_points": 3},
        "state_dir": "state",
        **overrides,
    }
    return EdgeConfig.from_dict(data, base=folder)


def test_agent_scores_every_window_sends_events_and_quarantines_bad_rows(tmp_path: Path) -> None:
    write_fleet(tmp_path)
    cfg = config(tmp_path)
    sink = ListSink()
    agent = EdgeAgent(cfg, load_scorer(cfg.model), sink)
    stats = agent.run(FileReplay(cfg.sources[0]))

    predictions = [m for m in sink.messages if isinstance(m, Prediction)]
    events = [m for m in sink.messages if isinstance(m, EdgeEvent)]
    assert stats.readings == 48
    # Windows end every 15 minutes from 00:15 to 01:45 for each machine: 7 each.
    assert len(predictions) == 14 == stats.predictions
    assert {p.machine_id for p in predictions} == {"m1", "m2"}
    assert all(p.model_name == "drift-zscore" and 0 <= p.max_risk <= 1 for p in predictions)
    assert all(p.threshold is None for p in predictions)  # the baseline has no threshold of its own
    assert [e.event for e in events] == ["error:E7", "failure:bearing"]
    # (edge_id, seq) is unique across everything the edge sent
    seqs = [m.seq for m in sink.messages]  # type: ignore[attr-defined]
    assert len(set(seqs)) == len(seqs)
    quarantined = (tmp_path / "state" / "quarantine.jsonl").read_text()
    assert stats.quarantined == 3
    assert "sensor temp='NaNx' is not a number" in quarantined
    assert "timestamp is in the future" in quarantined
    assert "explode" in quarantined


def test_sequence_numbers_never_repeat_across_restarts(tmp_path: Path) -> None:
    write_fleet(tmp_path)
    cfg = config(tmp_path)
    first, second = ListSink(), ListSink()
    EdgeAgent(cfg, load_scorer(cfg.model), first).run(FileReplay(cfg.sources[0]))
    EdgeAgent(cfg, load_scorer(cfg.model), second).run(FileReplay(cfg.sources[0]))
    a = {m.seq for m in first.messages}  # type: ignore[attr-defined]
    b = {m.seq for m in second.messages}  # type: ignore[attr-defined]
    assert a and b and not a & b


def test_config_errors_name_the_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_text("edge_id: 'bad id!'\nsources: []\nwindow: {length: soon}\n")
    with pytest.raises(ConfigError) as err:
        EdgeConfig.load(path)
    text = str(err.value)
    assert "edge_id" in text and "sources" in text and "window.length" in text
    with pytest.raises(ConfigError, match="no such config file"):
        EdgeConfig.load(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"model: .*needs `artifact`"):
        EdgeConfig.from_dict({"edge_id": "e", "sources": [{"telemetry": "t.csv"}], "model": {"type": "lm"}})


class BrokenScorer:
    name, version, horizon_h = "broken", "9", 24.0

    def score(self, window: object) -> dict[str, float]:
        raise RuntimeError("session lost")

    def score_many(self, windows: list[object]) -> list[dict[str, float]]:
        raise RuntimeError("session lost")


def test_a_model_failing_at_run_time_is_rolled_back_and_the_previous_one_scores(tmp_path: Path) -> None:
    from edge_agent.scorers import RunningModel, ScorerSlot

    write_fleet(tmp_path)
    cfg = config(tmp_path)
    slot = ScorerSlot(RunningModel(load_scorer(cfg.model)))
    slot.swap(RunningModel(BrokenScorer()))  # an update that verified and self-tested, then broke
    sink = ListSink()
    EdgeAgent(cfg, slot, sink).run(FileReplay(cfg.sources[0]))
    predictions = [m for m in sink.messages if isinstance(m, Prediction)]
    assert len(predictions) == 14 and {p.model_name for p in predictions} == {"drift-zscore"}
    assert slot.rollbacks == 1 and slot.running.scorer.name == "drift-zscore"


def test_without_a_model_to_roll_back_to_the_windows_are_quarantined_and_the_agent_goes_on(tmp_path: Path) -> None:
    write_fleet(tmp_path)
    cfg = config(tmp_path)
    agent = EdgeAgent(cfg, BrokenScorer(), ListSink())
    stats = agent.run(FileReplay(cfg.sources[0]))
    assert stats.predictions == 0 and stats.scoring_errors == 14
    assert agent.quarantine.counts["scorer"] == 14
    assert "scoring failed: RuntimeError: session lost" in (tmp_path / "state" / "quarantine.jsonl").read_text()


def test_unknown_machines_and_machines_past_the_limit_are_quarantined(tmp_path: Path) -> None:
    write_fleet(tmp_path)
    allow = config(tmp_path, machines={"allow": ["m2"]})
    agent = EdgeAgent(allow, load_scorer(allow.model), ListSink())
    stats = agent.run(FileReplay(allow.sources[0]))
    assert stats.readings == 24 and agent.quarantine.counts["unknown_machine"] == 24 + 2  # m1's readings and events
    capped = config(tmp_path, machines={"max": 1}, state_dir="state2")
    agent = EdgeAgent(capped, load_scorer(capped.model), ListSink())
    stats = agent.run(FileReplay(capped.sources[0]))
    assert agent.windows.machines == 1 and agent.quarantine.counts["unknown_machine"] > 0
    assert "over machines.max" in (tmp_path / "state2" / "quarantine.jsonl").read_text()


class ThresholdedScorer:
    """Like the LM runtime: a model that carries the alert threshold chosen on its validation data."""

    name, version, horizon_h, threshold = "lm", "3", 24.0, 0.37

    def score(self, window: object) -> dict[str, float]:
        return {"failure": 0.5}

    def score_many(self, windows: list[object]) -> list[dict[str, float]]:
        return [self.score(w) for w in windows]


def test_predictions_carry_their_models_own_threshold(tmp_path: Path) -> None:
    write_fleet(tmp_path)
    cfg = config(tmp_path)
    sink = ListSink()
    EdgeAgent(cfg, ThresholdedScorer(), sink).run(FileReplay(cfg.sources[0]))  # type: ignore[arg-type]
    predictions = [m for m in sink.messages if isinstance(m, Prediction)]
    assert len(predictions) == 14 and {(p.model_version, p.threshold) for p in predictions} == {("3", 0.37)}
