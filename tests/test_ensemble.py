"""Ensembles: models from several seeds read as one, from training through the checkpoint to the edge's ONNX graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from models.edge.registry import CONFIG_FILE
from models.edge.runtime import LMScorer
from models.edge.signing import load_public_keys
from models.training.dataset import Fleet, WindowSpec, build_windows
from models.training.export import MODEL_FILE, OUTPUT_NAME
from models.training.model import (
    EnsembleLM,
    ModelConfig,
    TorchScorer,
    build_model,
    load_causal_lm,
    load_checkpoint,
    member_folders,
)
from models.training.train import TrainSettings, train
from precursor.contracts.outcomes import ANY_FAILURE
from tests.test_lm_training import TINY, train_signed, write_tiny_fleet


def tiny_members(count: int, vocab_size: int = 40) -> list[torch.nn.Module]:
    members = []
    for seed in range(count):
        torch.manual_seed(seed)
        members.append(build_model(ModelConfig(vocab_size=vocab_size, n_embd=16, n_layer=1, n_head=2)).eval())
    return members


def test_the_ensemble_reads_as_its_members_mean_distribution(tmp_path: Path) -> None:
    members = tiny_members(3)
    ensemble = EnsembleLM(members).eval()
    ids = torch.randint(0, 40, (4, 9))
    with torch.no_grad():
        mean = torch.stack([m(input_ids=ids).logits.softmax(-1) for m in members]).mean(0)
        logits = ensemble(input_ids=ids).logits
    assert torch.allclose(logits.softmax(-1), mean, atol=1e-6)
    assert torch.allclose(logits.exp().sum(-1), torch.ones(4, 9), atol=1e-5)  # already normalised
    ensemble.save_pretrained(tmp_path)
    assert [p.name for p in member_folders(tmp_path)] == ["member-0", "member-1", "member-2"]
    reloaded = load_causal_lm(tmp_path)
    assert isinstance(reloaded, EnsembleLM) and len(reloaded.members) == 3
    with torch.no_grad():
        assert torch.allclose(reloaded.eval()(input_ids=ids).logits, logits, atol=1e-6)


def test_an_ensemble_with_a_missing_member_is_refused(tmp_path: Path) -> None:
    EnsembleLM(tiny_members(3)).save_pretrained(tmp_path)
    for name in ("model.safetensors", "config.json"):
        (tmp_path / "member-1" / name).unlink()
    with pytest.raises(ValueError, match=r"members \[0, 2\] are not numbered 0..1"):
        load_causal_lm(tmp_path)


def test_members_must_share_a_vocabulary() -> None:
    with pytest.raises(ValueError, match="vocabulary size"):
        EnsembleLM([*tiny_members(1, vocab_size=40), *tiny_members(1, vocab_size=41)])


def test_train_members_then_score_one_graph_at_the_edge(tmp_path: Path) -> None:
    fleet_files = write_tiny_fleet(tmp_path / "fleet")
    result, keys = train_signed(fleet_files, TrainSettings(**TINY, members=2, seed=3), tmp_path, version="0.3.0")
    artifact = tmp_path / "artifact"
    meta = json.loads((result.checkpoint_dir / CONFIG_FILE).read_text())
    assert meta["members"] == 2
    assert [m["seed"] for m in meta["training"]["member_fits"]] == [3, 4]
    assert [p.name for p in member_folders(result.checkpoint_dir)] == ["member-0", "member-1"]
    model, tokenizer, _ = load_checkpoint(result.checkpoint_dir)
    assert isinstance(model, EnsembleLM)

    # A member is exactly the model a plain run with its seed trains.
    alone = tmp_path / "alone"
    train(
        fleet_files["telemetry"],
        fleet_files["events"],
        alone,
        TrainSettings(**TINY, seed=4),
        machines=fleet_files["machines"],
    )
    plain = load_causal_lm(alone).state_dict()
    second = model.members[1].state_dict()
    assert all(torch.equal(plain[k], second[k]) for k in plain)

    # One graph at the edge: both members, each output head left fp32, and the scores torch gives.
    graph = onnx.load(str(artifact / MODEL_FILE)).graph
    heads = [n for n in graph.node if n.op_type == "MatMul" and n.output[0].endswith(f".{OUTPUT_NAME}")]
    assert sorted(n.output[0] for n in heads) == [f"m0.{OUTPUT_NAME}", f"m1.{OUTPUT_NAME}"]
    export = json.loads((artifact / "metrics.json").read_text())["export"]
    assert export["fp32_max_abs_logit_diff"] <= 1e-4 and export["int8_decision_agreement"] >= 0.99

    fleet = Fleet.load(fleet_files["telemetry"], fleet_files["events"], fleet_files["machines"])
    windows = [w.window for w in build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))]
    at_edge = np.array([r[ANY_FAILURE] for r in LMScorer.load(artifact, load_public_keys(keys)).score_many(windows)])
    in_cloud = np.array([r[ANY_FAILURE] for r in TorchScorer.load(result.checkpoint_dir).score_many(windows)])
    assert np.abs(at_edge - in_cloud).max() < 0.05  # int8 against fp32
    member_risks = [
        np.array([r[ANY_FAILURE] for r in TorchScorer(member, tokenizer, 12.0).score_many(windows)])
        for member in model.members
    ]
    # The risk renormalises over the outcome tokens, so the ensemble's is the mean of its members' weighted by the
    # mass each puts on those tokens: always between the two. (Before calibration, which maps the ensemble's risk.)
    ensemble_raw = np.array([r[ANY_FAILURE] for r in TorchScorer(model, tokenizer, 12.0).score_many(windows)])
    low, high = np.minimum(*member_risks), np.maximum(*member_risks)
    assert np.all((low - 1e-6 <= ensemble_raw) & (ensemble_raw <= high + 1e-6))
    assert np.abs(member_risks[0] - member_risks[1]).max() > 0.01  # and the members do differ
