"""The evidence: labeled windows split in time without leaks, the history backfill, and the rejections record."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from flows.evidence import split_evidence
from flows.labeled import read_labeled_windows, write_history
from flows.rejections import mark_rejected, rejected_versions
from models.edge.registry import ModelRegistry
from models.edge.scoring import Window
from models.training.dataset import (
    DatasetError,
    Fleet,
    LabeledWindow,
    WindowSpec,
    build_windows,
    label_known_by,
    labeled_failures,
    split_for_validation,
)
from precursor.contracts.formats import TelemetryTable
from precursor.contracts.messages import Event

HOUR = 3600
START = int(datetime(2026, 3, 1, tzinfo=UTC).timestamp())


def window(machine: str, end_h: float, outcome: str = "ok", to_failure_h: float | None = None) -> LabeledWindow:
    end = START + int(end_h * HOUR)
    t = np.array([end - 2 * HOUR, end - HOUR], dtype=np.int64)
    w = Window(
        machine,
        datetime.fromtimestamp(end - 3 * HOUR, UTC),
        datetime.fromtimestamp(end, UTC),
        t,
        ("v",),
        np.zeros((2, 1), dtype=np.float32),
    )
    return LabeledWindow(w, outcome, to_failure_h)


def test_a_label_is_known_once_its_failure_happened_or_its_horizon_passed() -> None:
    ok = window("m", 10)
    failed = window("m", 10, "bearing", 3.0)
    at = START + 12 * HOUR
    assert not label_known_by(ok, at, horizon_h=4)  # its horizon ends at 14 h
    assert label_known_by(ok, START + 14 * HOUR, horizon_h=4)
    assert not label_known_by(failed, START + 13 * HOUR, horizon_h=4)  # the failure is at 13 h
    assert label_known_by(failed, START + 13 * HOUR + 1, horizon_h=4)


def test_training_windows_never_see_a_label_decided_inside_the_held_out_window() -> None:
    windows = [window("m", h) for h in range(0, 100, 2)]
    windows += [window("m", 90, "bearing", 4.0), window("m", 60, "bearing", 1.0)]
    evidence = split_evidence(windows, holdout_h=20, horizon_h=10)
    assert evidence.held_out_from_s == START + 98 * HOUR + 1 - 20 * HOUR
    assert all(w.end_s >= evidence.held_out_from_s for w in evidence.held_out)
    assert all(label_known_by(w, evidence.held_out_from_s, 10) for w in evidence.training)
    ends = {w.end_s for w in evidence.training}
    assert START + 66 * HOUR in ends and START + 70 * HOUR not in ends  # 70 h + 10 h horizon reaches past 78 h
    assert any(w.outcome == "bearing" for w in evidence.training)  # the 61 h failure was settled in time


def test_empty_evidence_and_evidence_without_settled_labels_are_refused_by_name() -> None:
    with pytest.raises(DatasetError, match="holds no windows"):
        split_evidence([], holdout_h=10, horizon_h=10)
    with pytest.raises(DatasetError, match="shorten holdout_h"):
        split_evidence([window("m", h) for h in range(5)], holdout_h=100, horizon_h=10)


def test_validation_holds_the_last_failures_and_needs_one_more_to_learn_from() -> None:
    windows = [window("m", h) for h in range(0, 200, 2)]
    windows += [window("m", f - 2, "bearing", 2.0) for f in (30, 80, 120, 160)]
    assert [f.time_s for f in labeled_failures(windows)] == [START + f * HOUR for f in (30, 80, 120, 160)]
    train, validation = split_for_validation(windows, horizon_h=10, fraction=0.2, min_failures=2)
    assert min(w.end_s for w in validation) == START + 110 * HOUR  # one horizon before the 120 h failure
    assert all(label_known_by(w, START + 110 * HOUR, 10) for w in train)
    with pytest.raises(DatasetError, match="holds 4 failure\\(s\\): training needs at least 5"):
        split_for_validation(windows, horizon_h=10, fraction=0.2, min_failures=4)


def fleet(machines: list[str], hours: int) -> Fleet:
    ids, stamps, values = [], [], []
    for m in machines:
        for h in range(hours):
            ids.append(m)
            stamps.append(START + h * HOUR)
            values.append([float(h % 7)])
    failure = Event(
        timestamp=datetime.fromtimestamp(START + 40 * HOUR, UTC), machine_id=machines[0], event="failure:bearing"
    )
    table = TelemetryTable(
        np.array(ids, dtype=object), np.array(stamps, dtype=np.int64), ["v"], np.array(values, dtype=np.float32)
    )
    return Fleet(table, {machines[0]: [failure]}, {})


def test_history_written_as_examples_reads_back_joined_with_telemetry(tmp_path: Path) -> None:
    spec = WindowSpec(window_h=6, horizon_h=12, every_h=3)
    both = fleet(["m-1", "m-2"], 60)
    windows = build_windows(both, spec)
    assert write_history(windows, tmp_path / "labeled", horizon_h=12) == len(windows)
    read = read_labeled_windows(tmp_path / "labeled", both, spec)
    assert read.rows == len(windows) and read.without_telemetry == 0
    assert [(w.window.machine_id, w.end_s, w.outcome, w.hours_to_failure) for w in read.windows] == [
        (w.window.machine_id, w.end_s, w.outcome, w.hours_to_failure if w.failed else None) for w in windows
    ]
    assert {w.outcome for w in read.windows} == {"ok", "bearing"}
    # Telemetry of one machine only: the other's examples are counted, not guessed.
    one = read_labeled_windows(tmp_path / "labeled", fleet(["m-1"], 60), spec)
    assert one.without_telemetry == sum(1 for w in windows if w.window.machine_id == "m-2")


def test_a_missing_dataset_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"labeled_dataset='.*nowhere' is not a folder"):
        read_labeled_windows(tmp_path / "nowhere", fleet(["m-1"], 10), WindowSpec(window_h=6, horizon_h=12))


def test_rejections_accumulate_next_to_the_champion_pointer(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path, trusted_keys={})
    mark_rejected(registry, "2", "canary failing")
    mark_rejected(registry, "3", "canary silent")
    assert {v: r["reason"] for v, r in rejected_versions(registry).items()} == {
        "2": "canary failing",
        "3": "canary silent",
    }
    (registry.model_dir / "rejected.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="should hold a JSON object, holds list"):
        rejected_versions(registry)
