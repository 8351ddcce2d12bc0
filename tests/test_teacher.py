"""The trees as the LM's teacher: out-of-fold risks by machine, and the soft-target loss beside the hard one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from models.edge.tokenizer import TelemetryTokenizer
from models.training.dataset import Fleet, LabeledWindow, WindowSpec, build_windows
from models.training.evaluate import average_precision
from models.training.model import ModelConfig, build_model
from models.training.teacher import machine_folds, teacher_risks
from models.training.train import EncodedWindows, TrainSettings, sequence_loss, teacher_bce, train
from precursor.contracts.outcomes import OK
from tests.test_lm_training import TINY, write_tiny_fleet


@pytest.fixture(scope="module")
def fleet_windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], list[LabeledWindow]]:
    files = write_tiny_fleet(tmp_path_factory.mktemp("teacher-fleet"), machines=8)
    fleet = Fleet.load(files["telemetry"], files["events"], files["machines"])
    return files, build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))


def test_machine_folds_keep_each_machine_whole_and_use_every_fold() -> None:
    machines = [f"m{i % 7}" for i in range(70)]
    folds = machine_folds(machines, 4, seed=3)
    assert sorted(set(folds.tolist())) == [0, 1, 2, 3]
    for m in set(machines):
        assert len({int(f) for f, n in zip(folds, machines, strict=True) if n == m}) == 1
    assert machine_folds(machines, 4, seed=3).tolist() == folds.tolist()


def test_a_machines_teacher_risk_never_sees_its_own_labels(
    fleet_windows: tuple[dict[str, Path], list[LabeledWindow]],
) -> None:
    _, windows = fleet_windows
    settings = TrainSettings(**TINY).tokenizer.model_dump(mode="json")
    risks = teacher_risks(windows, settings, seed=0)
    assert risks.shape == (len(windows),) and risks.dtype == np.float32
    assert ((risks >= 0) & (risks <= 1)).all()
    failed = np.array([w.failed for w in windows])
    # The tiny fleet's failures are easy to see coming, so trees that never saw a machine still rank its windows.
    assert (average_precision(failed, risks) or 0) > 0.6

    # Call every window of one machine ok: its own risks must not move, since they come from the other machines' trees.
    target = windows[0].window.machine_id
    relabelled = [LabeledWindow(w.window, OK, None) if w.window.machine_id == target else w for w in windows]
    again = teacher_risks(relabelled, settings, seed=0)
    mine = np.array([w.window.machine_id == target for w in windows])
    assert failed[mine].any()  # the relabelling took failures away
    np.testing.assert_array_equal(again[mine], risks[mine])
    assert not np.array_equal(again[~mine], risks[~mine])  # the others' trees did learn from those labels


def test_the_soft_loss_is_binary_cross_entropy_on_whether_a_failure_comes() -> None:
    # Vocabulary: 0 <ok>, 1 <failure:a>, 2 <failure:b>, 3 some other token.
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.3], [0.1, 1.5, 0.2, -0.4]])
    teacher = torch.tensor([0.1, 0.7])
    p = torch.softmax(logits, dim=-1)
    fail = p[:, 1] + p[:, 2]
    expected = -(teacher * fail.log() + (1 - teacher) * (1 - fail).log()).mean()
    assert teacher_bce(logits, teacher, [1, 2]).item() == pytest.approx(expected.item(), rel=1e-5)
    # Lowest where the model's failure mass is the teacher's.
    matched = torch.log(torch.tensor([[0.9, 0.05, 0.05, 1e-9], [0.3, 0.35, 0.35, 1e-9]]))
    assert teacher_bce(matched, teacher, [1, 2]) < teacher_bce(logits, teacher, [1, 2])


def test_sequence_loss_adds_the_weighted_soft_loss_and_batches_carry_the_teacher(
    fleet_windows: tuple[dict[str, Path], list[LabeledWindow]],
) -> None:
    _, windows = fleet_windows
    windows = windows[:12]
    tokenizer = TelemetryTokenizer(TrainSettings(**TINY).tokenizer)
    tokenizer.fit([w.window for w in windows], [w.outcome for w in windows])
    encoded = replace(EncodedWindows.of(tokenizer, windows), teacher=np.linspace(0, 1, 12, dtype=np.float32))
    assert encoded.subset(np.array([3, 5])).teacher.tolist() == pytest.approx([3 / 11, 5 / 11])
    assert len(encoded.concat(encoded).teacher) == 24
    assert encoded.concat(replace(encoded, teacher=None)).teacher is None  # half a teacher is none

    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, n_positions=65, n_embd=16, n_head=2, n_layer=1))
    model.eval()
    failure_ids = [i for kind, i in tokenizer.outcome_tokens.items() if kind != OK]
    plain = sequence_loss(model, encoded, tokenizer.pad_id, 65, aux_loss_weight=0.0, failure_ids=failure_ids)
    half, whole = (
        sequence_loss(
            model, encoded, tokenizer.pad_id, 65, aux_loss_weight=0.0, failure_ids=failure_ids, teacher_weight=w
        )
        for w in (0.5, 1.0)
    )
    assert half.total.item() > plain.total.item()
    assert whole.total.item() - plain.total.item() == pytest.approx(
        2 * (half.total.item() - plain.total.item()), rel=1e-5
    )
    without = sequence_loss(
        model,
        replace(encoded, teacher=None),
        tokenizer.pad_id,
        65,
        aux_loss_weight=0.0,
        failure_ids=failure_ids,
        teacher_weight=1.0,
    )
    assert without.total.item() == pytest.approx(plain.total.item(), rel=1e-6)  # no risks, no soft term
    assert half.outcome == pytest.approx(plain.outcome, rel=1e-6)  # the hard term is unchanged


def test_training_with_a_teacher_records_it_and_learns(
    fleet_windows: tuple[dict[str, Path], list[LabeledWindow]], tmp_path: Path
) -> None:
    files, _ = fleet_windows
    settings = TrainSettings(**{**TINY, "teacher_weight": 1.0})
    result = train(files["telemetry"], files["events"], tmp_path / "model", settings, machines=files["machines"])
    assert result.meta.training["teacher_weight"] == 1.0
    assert result.meta.validation["pr_auc"] > 0.5
