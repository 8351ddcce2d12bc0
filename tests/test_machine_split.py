"""Splits by machine: held-out test machines by a hash of their id or a list, and validation on other machines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer

from models.training.dataset import (
    DatasetError,
    Fleet,
    LabeledWindow,
    MachineSplit,
    MachineValidation,
    WindowSpec,
    build_windows,
    choose_split,
    choose_validation_machines,
    outcome_counts,
    split_from_json,
    split_windows,
)
from precursor.simulator import FleetConfig, write_fleet


@pytest.fixture(scope="module")
def fleet_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    files = write_fleet(
        FleetConfig(machines=20, duration="12d", interval="1h", seed=3, mtbf="3d"), tmp_path_factory.mktemp("fleet")
    )
    return {"telemetry": files.telemetry, "events": files.events, "machines": files.machines}


@pytest.fixture(scope="module")
def fleet(fleet_files: dict[str, Path]) -> Fleet:
    return Fleet.load(fleet_files["telemetry"], fleet_files["events"], fleet_files["machines"])


def machine_windows(fleet: Fleet, spec: WindowSpec) -> list[LabeledWindow]:
    return build_windows(fleet, spec)


def test_a_fraction_holds_out_about_that_share_the_same_way_every_time() -> None:
    ids = [f"drive-{i:04d}" for i in range(2000)]
    split = MachineSplit.parse("0.3")
    held = {m for m in ids if split.holds_out(m)}
    assert 0.27 < len(held) / len(ids) < 0.33
    again = MachineSplit.parse("0.3")
    assert {m for m in reversed(ids) if again.holds_out(m)} == held  # order and instance do not matter
    assert MachineSplit.from_json(split.to_json()).holds_out("drive-0001") == split.holds_out("drive-0001")
    smaller = {m for m in ids if MachineSplit.parse("0.1").holds_out(m)}
    assert smaller < held  # a smaller share is a subset: growing the test set never moves a machine into training


def test_a_file_lists_the_test_machines(tmp_path: Path) -> None:
    listing = tmp_path / "test-machines.txt"
    listing.write_text("# held out for the audit\nm-002\n\nm-007  # the noisy one\n")
    split = MachineSplit.parse(str(listing))
    assert [m for m in ("m-001", "m-002", "m-007") if split.holds_out(m)] == ["m-002", "m-007"]
    assert MachineSplit.from_json(split.to_json()).listed == split.listed


@pytest.mark.parametrize(
    ("value", "complaint"),
    [("1.5", "strictly between 0 and 1"), ("0", "strictly between 0 and 1"), ("nope.txt", "neither a fraction")],
)
def test_bad_test_machines_are_refused_by_name(value: str, complaint: str) -> None:
    with pytest.raises(DatasetError, match=complaint):
        MachineSplit.parse(value)


def test_an_empty_list_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "none.txt"
    listing.write_text("# nobody\n")
    with pytest.raises(DatasetError, match="lists no machine"):
        MachineSplit.parse(str(listing))


def test_a_split_fleet_loses_nothing_and_shares_no_machine(fleet: Fleet) -> None:
    train, test = MachineSplit.parse("0.3").apply(fleet, fleet)
    assert set(train.machine_ids).isdisjoint(test.machine_ids)
    assert set(train.machine_ids) | set(test.machine_ids) == set(fleet.machine_ids)
    assert len(train.table.timestamps) + len(test.table.timestamps) == len(fleet.table.timestamps)
    for part in (train, test):
        assert set(part.events) <= set(part.machine_ids) and set(part.attributes) == set(part.machine_ids)
        for machine_id, rows in part.table.machines():
            (original,) = [r for m, r in fleet.table.machines() if m == machine_id]
            assert np.array_equal(part.table.values[rows], fleet.table.values[original], equal_nan=True)
    assert len(train.failures()) + len(test.failures()) == len(fleet.failures())


def test_validation_by_machine_holds_failures_on_machines_training_never_sees(fleet: Fleet) -> None:
    spec = WindowSpec(window_h=12, horizon_h=12)
    split = choose_validation_machines(fleet, fraction=0.2, min_failures=3)
    train, validation = split_windows(fleet, spec, split)
    train_machines = {w.window.machine_id for w in train}
    validation_machines = {w.window.machine_id for w in validation}
    assert train_machines.isdisjoint(validation_machines) and validation_machines <= split.machines
    failed_machines = {w.window.machine_id for w in validation if w.failed}
    assert len({(w.window.machine_id, w.hours_to_failure + w.end_s / 3600) for w in validation if w.failed}) >= 3
    assert failed_machines and any(w.failed for w in train)
    assert len(train) + len(validation) == len(build_windows(fleet, spec))  # every window, on one side
    assert split_from_json(json.loads(json.dumps(split.to_json()))) == split
    with pytest.raises(DatasetError, match="validation share needs 500"):
        choose_validation_machines(fleet, min_failures=500)


def test_validation_by_machine_ends_where_training_data_ends(fleet: Fleet) -> None:
    """``--until`` with validation by machine: no window of either side ends after it, and no label knows later."""
    spec = WindowSpec(window_h=12, horizon_h=12)
    first = int(fleet.table.timestamps.min())
    until = first + (fleet.last_time_s - first) // 2
    split = choose_validation_machines(fleet, until_s=until, fraction=0.2, min_failures=1)
    assert split.until_s == until
    train, validation = split_windows(fleet, spec, split)
    assert train and validation
    for w in [*train, *validation]:
        assert w.end_s < until
        assert not w.failed or w.end_s + w.hours_to_failure * 3600 < until
        assert w.failed or w.end_s + 12 * 3600 <= until
    failures_before = {f.machine_id for f in fleet.failures() if f.time_s < until}
    assert {w.window.machine_id for w in validation if w.failed} <= failures_before & split.machines


def test_train_and_evaluate_with_test_machines_never_train_on_the_machines_they_test(
    tmp_path: Path, fleet_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from models.training.model import read_meta
    from precursor.models_cli import evaluate_command, train_command

    files = {name: fleet_files[name] for name in ("telemetry", "events", "machines")}
    model = tmp_path / "model"
    train_command(
        **files,
        out=model,
        horizon="12h",
        test_machines="0.3",
        scaling="fleet",
        max_steps=10,
        n_layer=1,
        n_embd=16,
        n_head=2,
        max_length=64,
        quiet=True,
    )
    meta = read_meta(model)
    assert meta.data["test_machines"]["fraction"] == 0.3
    fleet = Fleet.load(*files.values())
    split = MachineSplit.parse("0.3")
    held = {m for m in fleet.machine_ids if split.holds_out(m)}
    assert 0 < len(held) < len(fleet.machine_ids)
    spec = WindowSpec(window_h=12, horizon_h=12, event_lookback_h=12 + 72)
    kept = fleet.only(lambda m: m not in held)
    # Test machines are new to the model, so by default it validates on training machines held out the same way.
    by_machine = choose_validation_machines(kept)
    assert split_from_json(meta.data["split"]) == by_machine
    training, validation = split_windows(kept, spec, by_machine)
    assert not {w.window.machine_id for w in training} & by_machine.machines
    assert meta.data["training_windows"] == outcome_counts(training)
    assert meta.data["validation_windows"] == outcome_counts(validation)
    assert not {w.window.machine_id for w in [*training, *validation]} & held
    capsys.readouterr()
    evaluate_command(model=model, **files, json_output=True, quiet=True)
    report = json.loads(capsys.readouterr().out)
    tested = machine_windows(fleet.only(lambda m: m in held), spec)
    assert report["model"]["windows"] == len(tested)  # every window of the held-out machines, and nothing else
    assert report["baselines"]["gradient-boosting"]["windows"] == len(tested)


def test_validation_by_time_can_still_be_asked_for_with_test_machines(
    tmp_path: Path, fleet_files: dict[str, Path]
) -> None:
    from models.training.model import read_meta
    from precursor.models_cli import train_command

    files = {name: fleet_files[name] for name in ("telemetry", "events", "machines")}
    small = dict(horizon="12h", test_machines="0.3", max_steps=2, n_layer=1, n_embd=16, n_head=2, max_length=64)
    small["set_"] = ["search=[]", "teacher_weight=0", "refit=false"]  # the split is the point, not the model
    train_command(**files, out=tmp_path / "model", validation="time", quiet=True, **small)  # type: ignore[arg-type]
    meta = read_meta(tmp_path / "model")
    kept = Fleet.load(*files.values()).only(lambda m: not MachineSplit.parse("0.3").holds_out(m))
    by_time = choose_split(kept, 12)
    assert split_from_json(meta.data["split"]) == by_time and not isinstance(by_time, MachineValidation)
    spec = WindowSpec(window_h=12, horizon_h=12, event_lookback_h=12 + 72)
    assert meta.data["validation_windows"] == outcome_counts(split_windows(kept, spec, by_time)[1])
    with pytest.raises(typer.BadParameter, match="choose time or machines"):
        train_command(**files, out=tmp_path / "other", validation="engines", quiet=True, **small)  # type: ignore[arg-type]
