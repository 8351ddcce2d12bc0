"""Refit (issue #17 item 3): after validation chose the step, threshold and calibration, the saved model is trained
again on training + validation windows."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import models.training.train as training
from models.edge.calibration import Calibration, fit_platt
from models.edge.registry import CONFIG_FILE
from models.training.dataset import Fleet, LabeledWindow, choose_split, split_windows
from models.training.model import load_checkpoint, takes_values
from models.training.train import (
    EncodedWindows,
    FitResult,
    TrainResult,
    TrainSettings,
    describe,
    train_on_windows,
    validation_scores,
)
from tests.test_lm_training import TINY, write_tiny_fleet

FAST = {**TINY, "max_steps": 30, "eval_every": 10, "warmup_steps": 5, "max_minutes": 5.0}


@dataclass
class Call:
    """One fit_model call: what it learned from, whether it chose on validation, and what it returned."""

    windows: int
    failed: int
    chose: bool
    max_steps: int
    max_minutes: float
    result: FitResult


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[LabeledWindow], list[LabeledWindow]]:
    files = write_tiny_fleet(tmp_path_factory.mktemp("refit-fleet"))
    settings = TrainSettings(**FAST)
    fleet = Fleet.load(files["telemetry"], files["events"], files["machines"])
    split = choose_split(
        fleet,
        settings.horizon_h,
        fraction=settings.validation_fraction,
        min_failures=settings.min_validation_failures,
    )
    train, validation = split_windows(fleet, settings.window_spec(), split)
    return list(train), list(validation)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Every fit_model call train_on_windows makes, with its result."""
    seen: list[Call] = []
    real = training.fit_model

    def recording(model: Any, tokenizer: Any, train: EncodedWindows, validation: Any, settings: Any, *a: Any) -> Any:
        result = real(model, tokenizer, train, validation, settings, *a)
        state = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
        seen.append(
            Call(
                len(train.ids),
                int(train.failed.sum()),
                validation is not None,
                settings.max_steps,
                settings.max_minutes,
                FitResult(state, result.step, result.validation, result.history, result.seconds, result.seed),
            )  # type: ignore[arg-type]
        )
        return result

    monkeypatch.setattr(training, "fit_model", recording)
    yield seen


def selection_model(call: Call, like: torch.nn.Module) -> torch.nn.Module:
    """The model validation chose, rebuilt from the weights a call recorded."""
    model = copy.deepcopy(like)
    model.load_state_dict(call.result.model)  # type: ignore[arg-type]
    return model.eval()


def saved_weights(result: TrainResult) -> dict[str, torch.Tensor]:
    return load_file(result.checkpoint_dir / "model.safetensors")


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    shared = set(a) & set(b)
    return bool(shared) and all(torch.equal(a[k], b[k]) for k in shared)


def test_refit_learns_training_and_validation_and_is_what_gets_saved(
    windows: tuple[list[LabeledWindow], list[LabeledWindow]], calls: list[Call], tmp_path: Path
) -> None:
    train, validation = windows
    result = train_on_windows(train, validation, tmp_path / "model", TrainSettings(**FAST, refit=True))
    selection, refit = calls
    assert (selection.windows, selection.chose) == (len(train), True)
    assert (refit.windows, refit.chose) == (len(train) + len(validation), False)
    assert refit.failed == sum(w.failed for w in train) + sum(w.failed for w in validation)
    # the chosen step, scaled by how many more windows the refit sees; then the refit runs exactly that many
    wanted = round(selection.result.step * (len(train) + len(validation)) / len(train))
    assert refit.max_steps == wanted == refit.result.step == refit.result.history[-1]["step"]
    assert all("validation_pr_auc" not in record for record in refit.result.history)
    # the selection run took its share of the time budget, the refit what was left of it
    assert selection.max_minutes == pytest.approx(5.0 * len(train) / (2 * len(train) + len(validation)))
    assert refit.max_minutes <= 5.0 - selection.result.seconds / 60 + 1e-6

    saved = saved_weights(result)
    assert same_weights(saved, refit.result.model)  # type: ignore[arg-type]
    assert not same_weights(saved, selection.result.model)  # type: ignore[arg-type]

    meta = json.loads((result.checkpoint_dir / CONFIG_FILE).read_text())
    recorded = meta["training"]["refit"]
    assert recorded["windows"] == len(train) + len(validation)
    assert recorded["failed_windows"] == refit.failed
    assert (recorded["steps"], recorded["selected_steps"]) == ([wanted], [selection.result.step])
    assert meta["step"] == selection.result.step  # what validation chose; the refit's steps are beside it
    assert set(meta["validation"]["refit_in_sample"]) == {"pr_auc", "alert_rate", "selected_alert_rate"}
    assert meta["training"]["seconds"] >= round(selection.result.seconds + refit.result.seconds, 1) - 0.1
    assert f"refit for {wanted} steps on training + validation" in describe(result.meta)

    # the threshold and calibration map are the selected model's, chosen out of sample: fitted on its validation
    # risks, not on the saved model's (which learned those windows)
    model, tokenizer, reloaded = load_checkpoint(result.checkpoint_dir)
    encoded = EncodedWindows.of(tokenizer, validation, values=takes_values(model))
    failed = [w.failed for w in validation]
    selected = fit_platt(failed, validation_scores(selection_model(selection, model), tokenizer, encoded))
    calibration = Calibration.model_validate(meta["calibration"])
    assert (calibration.a, calibration.b) == pytest.approx((selected.a, selected.b))
    assert reloaded.threshold == pytest.approx(calibration.probability(meta["validation"]["raw_threshold"]))
    refit_map = fit_platt(failed, validation_scores(model, tokenizer, encoded))
    assert selected.is_identity or (refit_map.a, refit_map.b) != (calibration.a, calibration.b)


def test_refit_off_saves_the_model_validation_chose(
    windows: tuple[list[LabeledWindow], list[LabeledWindow]], calls: list[Call], tmp_path: Path
) -> None:
    train, validation = windows
    result = train_on_windows(train, validation, tmp_path / "model", TrainSettings(**FAST, refit=False))
    (only,) = calls
    assert (only.windows, only.chose, only.max_minutes) == (len(train), True, 5.0)
    assert same_weights(saved_weights(result), only.result.model)  # type: ignore[arg-type]
    meta = json.loads((result.checkpoint_dir / CONFIG_FILE).read_text())
    assert meta["training"]["refit"] is False  # the setting; no record of a refit beside it
    assert "refit_in_sample" not in meta["validation"]
    assert "refit" not in describe(result.meta)


def test_each_member_is_refit_from_its_own_seed(
    windows: tuple[list[LabeledWindow], list[LabeledWindow]], calls: list[Call], tmp_path: Path
) -> None:
    train, validation = windows
    settings = TrainSettings(**{**FAST, "max_steps": 20}, members=2, seed=5, refit=True)
    result = train_on_windows(train, validation, tmp_path / "model", settings)
    assert [(c.chose, c.result.seed) for c in calls] == [(True, 5), (True, 6), (False, 5), (False, 6)]
    scale = (len(train) + len(validation)) / len(train)
    assert [c.max_steps for c in calls[2:]] == [round(c.result.step * scale) for c in calls[:2]]
    meta = json.loads((result.checkpoint_dir / CONFIG_FILE).read_text())
    assert meta["training"]["refit"]["steps"] == [c.max_steps for c in calls[2:]]
    for member, refit in enumerate(calls[2:]):
        saved = load_file(result.checkpoint_dir / f"member-{member}" / "model.safetensors")
        assert same_weights(saved, refit.result.model)  # type: ignore[arg-type]


def test_encoded_windows_join_in_order() -> None:
    a = EncodedWindows([[1, 2]], np.array([7]), np.array([True]), np.array([1]), np.array([9]))
    b = EncodedWindows([[3], [4, 5]], np.array([6, 6]), np.array([False, False]), np.array([0, 0]), np.array([8, 8]))
    joined = a.concat(b)
    assert joined.ids == [[1, 2], [3], [4, 5]]
    assert joined.targets.tolist() == [7, 6, 6] and joined.failed.tolist() == [True, False, False]
    assert joined.body_start.tolist() == [1, 0, 0] and joined.followups.tolist() == [9, 8, 8]
    with pytest.raises(ValueError, match="with values"):
        a.concat(EncodedWindows([[3]], b.targets[:1], b.failed[:1], b.body_start[:1], b.followups[:1], [np.zeros(1)]))
