"""The value channel: statistic tokens that carry their value, from the tokenizer through training to the edge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from models.edge.outcome import pack_sequences
from models.edge.runtime import LMScorer
from models.edge.signing import load_public_keys
from models.edge.tokenizer import AGE_EDGES_H, TelemetryTokenizer, age_value
from models.training.dataset import Fleet, LabeledWindow, WindowSpec, build_windows
from models.training.evaluate import average_precision
from models.training.export import VALUES_INPUT, LastTokenLogits
from models.training.model import (
    ModelConfig,
    TorchScorer,
    ValueGPT2LMHeadModel,
    build_model,
    load_causal_lm,
    load_checkpoint,
    takes_values,
)
from models.training.train import EncodedWindows, TrainSettings, hide_readings
from precursor.contracts.outcomes import ANY_FAILURE
from tests.test_lm_training import TINY, train_signed, write_tiny_fleet

SETTINGS = {**TINY, "block_stats": ("mean", "std"), "window_stats": ("slope", "max")}


@pytest.fixture(scope="module")
def fleet_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tiny_fleet(tmp_path_factory.mktemp("value-fleet"))


@pytest.fixture(scope="module")
def labeled(fleet_files: dict[str, Path]) -> list[LabeledWindow]:
    fleet = Fleet.load(fleet_files["telemetry"], fleet_files["events"], fleet_files["machines"])
    return build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))


@pytest.fixture(scope="module")
def tokenizer(labeled: list[LabeledWindow]) -> TelemetryTokenizer:
    tok = TelemetryTokenizer(TrainSettings(**SETTINGS).tokenizer)
    tok.fit([w.window for w in labeled], outcomes=[w.outcome for w in labeled])
    return tok


def test_each_statistic_token_carries_a_value_inside_its_own_bin(
    tokenizer: TelemetryTokenizer, labeled: list[LabeledWindow]
) -> None:
    windows = [w.window for w in labeled[::7]]
    encoded = tokenizer.encode_with_values(windows)
    assert encoded.ids == tokenizer.encode_many(windows)
    sensors = list(tokenizer.state.scaling.sensors)
    checked = 0
    for ids, values in zip(encoded.ids, encoded.values, strict=True):
        assert values.dtype == np.float32 and values.shape == (len(ids),)
        for token, value in zip(tokenizer.decode(ids), values.tolist(), strict=True):
            sensor, _, rest = token.partition(":")
            if sensor not in sensors or rest[-1:] == "_":  # not a statistic, or a missing reading: no value
                assert value == 0.0, token
                continue
            key, b = rest[:-2], int(rest[-2:])
            edges = (-np.inf, *tokenizer.state.edges[key][sensors.index(sensor)], np.inf)
            # The bin says edges[b-1] <= statistic < edges[b]; the value is a rising function of the statistic.
            low, high = (np.sign(e) * np.log1p(abs(e)) for e in edges[b : b + 2])  # token_value, open ends kept
            assert low - 1e-5 <= value <= high + 1e-5, (token, value, edges[b : b + 2])
            checked += 1
    assert checked > 100


def test_with_age_values_each_hours_since_token_carries_its_age_inside_its_bin(
    tokenizer: TelemetryTokenizer, labeled: list[LabeledWindow]
) -> None:
    aged = TelemetryTokenizer(tokenizer.settings.model_copy(update={"age_values": True}))
    aged.fit([w.window for w in labeled], outcomes=[w.outcome for w in labeled])
    assert aged.content_hash != tokenizer.content_hash  # a model trained with ages is not served without them
    windows = [w.window for w in labeled[::5]]
    with_ages, without = aged.encode_with_values(windows), tokenizer.encode_with_values(windows)
    assert with_ages.ids == without.ids
    edges = (0.0, *AGE_EDGES_H, np.inf)
    checked = 0
    for ids, values, plain in zip(with_ages.ids, with_ages.values, without.values, strict=True):
        for position, token in enumerate(aged.decode(ids)):
            if "#a" not in token:  # not an age: the value it had without ages (a statistic's, or 0)
                assert values[position] == plain[position], token
                continue
            b = int(token.rsplit("#a", 1)[1])  # the bin says edges[b] <= hours < edges[b + 1]
            low, high = age_value(np.array(edges[b : b + 2]))
            assert low - 1e-5 <= values[position] <= high + 1e-5, (token, values[position])
            checked += 1
    assert checked > 50
    assert all(v == 0.0 for ids, vs in zip(with_ages.ids, with_ages.values, strict=True)
               for t, v in zip(aged.decode(ids), vs.tolist(), strict=True) if t.endswith("=never"))  # fmt: skip


def test_values_are_cut_and_padded_with_their_ids() -> None:
    packed = pack_sequences([[1, 2, 3, 4], [5]], pad_id=0, max_length=3, values=[[0.1, 0.2, 0.3, 0.4], [0.5]])
    assert packed.input_ids.tolist() == [[2, 3, 4], [5, 0, 0]]
    assert packed.values is not None
    np.testing.assert_allclose(packed.values, [[0.2, 0.3, 0.4], [0.5, 0.0, 0.0]], rtol=1e-6)
    with pytest.raises(ValueError, match="one entry per id"):
        pack_sequences([[1, 2]], pad_id=0, max_length=3, values=[[0.1]])


def test_a_model_with_a_value_channel_reads_values_and_reloads_as_itself(tmp_path: Path) -> None:
    model = build_model(ModelConfig(vocab_size=40, n_embd=16, n_layer=1, n_head=2, value_channel=True)).eval()
    assert isinstance(model, ValueGPT2LMHeadModel) and takes_values(model)
    assert not takes_values(build_model(ModelConfig(vocab_size=40, n_embd=16, n_layer=1, n_head=2)))
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    values = torch.randn(2, 9, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        zeros = model(input_ids=ids, values=torch.zeros(2, 9)).logits
        valued = model(input_ids=ids, values=values).logits
    assert torch.equal(plain, zeros)  # no values means every value is 0
    assert (valued - plain).abs().max() > 1e-3
    model.save_pretrained(tmp_path)
    again = load_causal_lm(tmp_path).eval()
    assert isinstance(again, ValueGPT2LMHeadModel)
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids, values=values).logits, valued)


def test_the_last_token_wrapper_reads_values_too() -> None:
    model = build_model(ModelConfig(vocab_size=40, n_embd=16, n_layer=1, n_head=2, value_channel=True)).eval()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    values = torch.randn(2, 9, generator=torch.Generator().manual_seed(1))
    last = torch.tensor([8, 5])
    with torch.no_grad():
        full = model(input_ids=ids, values=values).logits[torch.arange(2), last]
        wrapped = LastTokenLogits(model).eval()(ids, last, values)
        plain = LastTokenLogits(build_model(ModelConfig(vocab_size=40, n_embd=16, n_layer=1, n_head=2))).eval()
    assert torch.allclose(wrapped, full, atol=1e-5)
    with pytest.raises(ValueError, match="without a value channel"):
        plain(ids, last, values)


def test_hidden_readings_lose_their_value_too(tokenizer: TelemetryTokenizer, labeled: list[LabeledWindow]) -> None:
    encoded = EncodedWindows.of(tokenizer, labeled[:32], values=True)
    assert encoded.values is not None
    hidden = hide_readings(encoded, tokenizer.missing_ids(), 0.5, np.random.default_rng(0))
    assert hidden.values is not None
    changed = 0
    for before, after, kept, values in zip(encoded.ids, hidden.ids, encoded.values, hidden.values, strict=True):
        swapped = np.asarray(before) != np.asarray(after)
        changed += int(swapped.sum())
        assert np.all(values[swapped] == 0.0)
        assert np.array_equal(values[~swapped], kept[~swapped])
    assert changed > 0
    assert len(encoded.subset(np.array([3, 1])).values or []) == 2


def test_a_backbone_has_no_value_channel() -> None:
    with pytest.raises(ValidationError, match="value_channel works with the built-in model only"):
        TrainSettings(horizon_h=12, value_channel=True, backbone=Path("some-checkpoint"))


def test_train_export_and_score_at_the_edge_with_values(
    fleet_files: dict[str, Path], labeled: list[LabeledWindow], tmp_path: Path
) -> None:
    result, keys = train_signed(fleet_files, TrainSettings(**SETTINGS, value_channel=True), tmp_path)
    artifact = tmp_path / "artifact"
    model, _, _ = load_checkpoint(result.checkpoint_dir)
    assert isinstance(model, ValueGPT2LMHeadModel)
    config = json.loads((artifact / "precursor.json").read_text())
    assert config["onnx"]["inputs"] == ["input_ids", "last_index", VALUES_INPUT]
    export = json.loads((artifact / "metrics.json").read_text())["export"]
    assert export["fp32_max_abs_logit_diff"] <= 1e-4
    assert export["int8_windows_source"] == "validation windows" and export["int8_decision_agreement"] >= 0.99

    edge = LMScorer.load(artifact, load_public_keys(keys))
    cloud = TorchScorer.load(result.checkpoint_dir)
    windows = [w.window for w in labeled]
    failed = np.array([w.failed for w in labeled])
    at_edge = np.array([r[ANY_FAILURE] for r in edge.score_many(windows)])
    in_cloud = np.array([r[ANY_FAILURE] for r in cloud.score_many(windows)])
    assert np.abs(at_edge - in_cloud).max() < 0.05  # int8 against fp32
    assert average_precision(failed, at_edge) > 3 * failed.mean()
    with pytest.raises(ValueError, match="needs values"):
        edge.score_token_ids([[2, 3, 4]])
