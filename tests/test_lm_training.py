"""Training the telemetry language model on a tiny fleet: checkpoint layout, scoring, backbones, context lengths."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from models.edge.outcome import pack_sequences
from models.edge.registry import CONFIG_FILE
from models.edge.signing import generate_keypair
from models.edge.tokenizer import SequenceTooLongError, TelemetryTokenizer, fixed_length_of
from models.training.dataset import Fleet, WindowSpec, build_windows, choose_split, split_windows
from models.training.evaluate import average_precision
from models.training.model import (
    ModelConfig,
    TorchScorer,
    build_model,
    count_parameters,
    hidden_and_head,
    init_ordinal_embeddings,
    load_backbone,
    load_checkpoint,
)
from models.training.train import (
    DEFAULT_SEARCH,
    EVENT_ROOM,
    EncodedWindows,
    TrainResult,
    TrainSettings,
    auxiliary_targets,
    fitted_tokenizer,
    hide_readings,
    outcome_nll,
    search_variants,
    sequence_loss,
    tokenizer_that_fits,
    train,
    training_device,
)

START = datetime(2026, 1, 1, tzinfo=UTC)


def write_tiny_fleet(directory: Path, *, machines: int = 6, hours: int = 320, seed: int = 0) -> dict[str, Path]:
    """A small fleet in the generic formats whose failures are easy to see coming.

    Hourly readings of ``temp``, ``vib`` and ``load`` (``load`` is blank 5% of the time). Every machine fails twice;
    for 12 hours before each failure ``vib`` climbs and error ``E7`` shows up. After a failure the part is
    maintained and the machine runs on. Odd machines fail as ``bearing``, even ones with no kind named.
    """
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / f"{name}.csv" for name in ("telemetry", "events", "machines")}
    telemetry_rows, event_rows = [], []
    for m in range(machines):
        machine_id = f"m-{m:02d}"
        offset = rng.normal(0, 2)
        failures = sorted(rng.choice(np.arange(60, hours - 20), size=2, replace=False).tolist())
        while failures[1] - failures[0] < 40:
            failures = sorted(rng.choice(np.arange(60, hours - 20), size=2, replace=False).tolist())
        for h in range(hours):
            t = START + timedelta(hours=h)
            to_failure = min((f - h for f in failures if f > h), default=10_000)
            ramp = max(0.0, 12 - to_failure) / 12 if to_failure <= 12 else 0.0
            vib = 1.0 + offset * 0.1 + 3.0 * ramp + rng.normal(0, 0.1)
            temp = 60 + offset + rng.normal(0, 0.5) + 5 * ramp
            load = "" if rng.random() < 0.05 else f"{0.5 + 0.3 * np.sin(h / 24 * 2 * np.pi):.3f}"
            telemetry_rows.append([t.isoformat(), machine_id, f"{temp:.3f}", f"{vib:.4f}", load])
            if ramp > 0 and rng.random() < 0.5:
                event_rows.append([(t + timedelta(minutes=30)).isoformat(), machine_id, "error:E7"])
            if rng.random() < 0.02:
                event_rows.append([(t + timedelta(minutes=10)).isoformat(), machine_id, "error:E1"])
        kind = "failure:bearing" if m % 2 else "failure"
        for f in failures:
            at = START + timedelta(hours=f)
            event_rows.append([at.isoformat(), machine_id, kind])
            event_rows.append([(at + timedelta(minutes=20)).isoformat(), machine_id, "maintenance:bearing"])
    with paths["telemetry"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "machine_id", "temp", "vib", "load"])
        writer.writerows(telemetry_rows)
    with paths["events"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "machine_id", "event"])
        writer.writerows(sorted(event_rows))
    with paths["machines"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["machine_id", "model", "serial"])
        writer.writerows([[f"m-{m:02d}", "A" if m < machines // 2 else "B", f"SN{m:04d}"] for m in range(machines)])
    return paths


TINY = {
    "horizon_h": 12.0,
    "window_h": 12.0,
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "batch_size": 32,
    "max_steps": 120,
    "eval_every": 40,
    "learning_rate": 5e-3,
    "max_length": 64,
    # One candidate: the default search would train each test's model twice (its own tests say what it does).
    "search": [],
}


def train_signed(
    fleet_files: dict[str, Path], settings: TrainSettings, directory: Path, version: str = "0.2.0"
) -> tuple[TrainResult, Path]:
    """Train on a tiny fleet's files and export the signed artifact to ``directory / "artifact"``; the key pair goes
    to ``directory / "keys"``. Returns the result and the keys folder."""
    keys = directory / "keys"
    generate_keypair(keys)
    result = train(
        fleet_files["telemetry"],
        fleet_files["events"],
        directory / "artifact",
        settings,
        machines=fleet_files["machines"],
        signing_key=keys / "precursor.key",
        version=version,
    )
    return result, keys


@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tiny_fleet(tmp_path_factory.mktemp("tiny-fleet"))


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_fleet: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model") / "model"
    train(
        tiny_fleet["telemetry"],
        tiny_fleet["events"],
        out,
        TrainSettings(**TINY),
        machines=tiny_fleet["machines"],
    )
    return out


def test_training_writes_a_checkpoint_that_reloads_and_scores(
    tiny_checkpoint: Path, tiny_fleet: dict[str, Path]
) -> None:
    names = {p.name for p in tiny_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", CONFIG_FILE} <= names
    meta = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    assert meta["horizon_h"] == 12.0
    assert 0.0 <= meta["threshold"] <= 1.0
    assert meta["architecture"]["n_layer"] == 1
    assert meta["step"] in {h["step"] for h in meta["training"]["history"]}
    assert set(meta["outcome_tokens"]) == {"ok", "failure", "bearing"}

    model, tokenizer, _ = load_checkpoint(tiny_checkpoint)
    assert model.config.vocab_size == tokenizer.vocab_size
    scorer = TorchScorer.load(tiny_checkpoint)
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))
    risks = scorer.score_many([w.window for w in windows[:40]])
    assert all(
        set(r) == {"failure", "bearing"} and 0 <= r["failure"] <= 1 and r["bearing"] <= r["failure"] + 1e-9
        for r in risks
    )
    # one window alone gets the same risk as inside a padded batch: right padding keeps positions
    assert scorer.score(windows[5].window)["failure"] == pytest.approx(risks[5]["failure"], abs=1e-5)


def test_training_learns_the_precursor_signal(tiny_checkpoint: Path, tiny_fleet: dict[str, Path]) -> None:
    meta = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    history = meta["training"]["history"]
    assert history[-1]["train_outcome_loss"] < history[0]["train_outcome_loss"]
    scorer = TorchScorer.load(tiny_checkpoint)
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))
    risk = np.array([r["failure"] for r in scorer.score_many([w.window for w in windows])])
    failed = np.array([w.failed for w in windows])
    assert average_precision(failed, risk) > 3 * failed.mean()  # far better than chance after 120 tiny steps
    assert risk[failed].mean() > 2 * risk[~failed].mean()


def test_training_refuses_data_without_enough_failures(tmp_path: Path) -> None:
    paths = write_tiny_fleet(tmp_path / "data", machines=1, hours=200)
    with pytest.raises(ValueError, match="failure"):
        train(paths["telemetry"], paths["events"], tmp_path / "out", TrainSettings(**TINY))


def test_a_search_keeps_the_candidate_validation_prefers_and_records_what_each_scored(
    tiny_checkpoint: Path, tiny_fleet: dict[str, Path], tmp_path: Path
) -> None:
    variants = [{"block_stats": ["mean", "slope"]}, {"n_embd": 16}]
    out = tmp_path / "searched"
    settings = TrainSettings(**{**TINY, "search": variants})
    train(tiny_fleet["telemetry"], tiny_fleet["events"], out, settings, machines=tiny_fleet["machines"])
    meta = json.loads((out / CONFIG_FILE).read_text())
    results = meta["training"]["search_results"]
    assert [r["overrides"] for r in results] == [{}, *variants]
    assert [r["kept"] for r in results].count(True) == 1
    kept = next(i for i, r in enumerate(results) if r["kept"])
    assert results[kept]["validation_pr_auc"] == max(r["validation_pr_auc"] for r in results)
    assert meta["validation"]["pr_auc"] == results[kept]["validation_pr_auc"]
    # What is saved is the kept candidate, and the record asks for the same search again.
    assert meta["training"]["tokenizer"]["block_stats"] == (["mean", "slope"] if kept == 1 else ["mean"])
    assert meta["architecture"]["n_embd"] == (16 if kept == 2 else TINY["n_embd"])
    assert meta["training"]["search"] == variants and meta["training"]["max_minutes"] == settings.max_minutes
    model, tokenizer, _ = load_checkpoint(out)
    assert model.config.vocab_size == tokenizer.vocab_size
    # The settings as given train as a plain run does: the search adds candidates, it does not change the first.
    plain = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    assert results[0]["validation_pr_auc"] == plain["validation"]["pr_auc"]
    assert results[0]["step"] == plain["step"]


def test_the_default_search_tries_block_slopes_where_the_sequence_is_short_and_nothing_where_it_is_long(
    tiny_checkpoint: Path, tiny_fleet: dict[str, Path], tmp_path: Path
) -> None:
    defaults = {k: v for k, v in TINY.items() if k != "search"}
    plain = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    fixed_length = TelemetryTokenizer.load(tiny_checkpoint).fixed_length
    assert TrainSettings(**defaults).search is None and fixed_length <= TrainSettings(**defaults).search_max_length

    searched_out, skipped_out = tmp_path / "searched", tmp_path / "skipped"
    files = (tiny_fleet["telemetry"], tiny_fleet["events"])
    train(*files, searched_out, TrainSettings(**defaults), machines=tiny_fleet["machines"])
    searched = json.loads((searched_out / CONFIG_FILE).read_text())
    assert searched["training"]["default_search"] == {
        "fixed_length": fixed_length,
        "search_max_length": TrainSettings(**defaults).search_max_length,
        "searched": True,
    }
    results = searched["training"]["search_results"]
    assert [r["overrides"] for r in results] == [{}, *DEFAULT_SEARCH]
    # The first candidate is the plain run, its tokenizer fitted before the search was decided.
    assert results[0]["validation_pr_auc"] == plain["validation"]["pr_auc"] and results[0]["step"] == plain["step"]

    # One token over the limit: no second candidate, and the model is the plain run's.
    train(
        *files,
        skipped_out,
        TrainSettings(**defaults, search_max_length=fixed_length - 1),
        machines=tiny_fleet["machines"],
    )
    skipped = json.loads((skipped_out / CONFIG_FILE).read_text())
    assert skipped["training"]["default_search"]["searched"] is False
    assert "search_results" not in skipped["training"]
    assert skipped["validation"] == plain["validation"] and skipped["step"] == plain["step"]


def test_the_default_search_leaves_out_a_variant_whose_sequences_would_not_fit_max_length(
    tiny_checkpoint: Path, tiny_fleet: dict[str, Path]
) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[:200]
    defaults = {k: v for k, v in TINY.items() if k not in {"search", "max_length"}}
    fitted = TelemetryTokenizer.load(tiny_checkpoint)
    as_given = fitted.fixed_length
    # A slope token beside each block's mean, for every sensor of every block.
    with_slopes = as_given + TrainSettings(**defaults).tokenizer.blocks * len(fitted.state.scaling.sensors)

    def variants(max_length: int) -> tuple[dict[str, Any], ...]:
        settings = TrainSettings(**defaults, max_length=max_length)
        tokenizer = TelemetryTokenizer(settings.tokenizer)
        tokenizer.fit([w.window for w in windows])
        assert tokenizer.fixed_length == as_given
        return search_variants(settings, tokenizer)

    # Room for the slopes: they are tried; one token short: the search is off instead of the training failing.
    assert variants(with_slopes) == DEFAULT_SEARCH
    assert variants(with_slopes - 1) == ()
    # A search given is searched whatever it costs; no tokenizer is needed to say so.
    given = ({"block_stats": ["mean", "slope"]},)
    assert search_variants(TrainSettings(**defaults, max_length=as_given, search=given)) == given
    with pytest.raises(ValueError, match="needs the tokenizer"):
        search_variants(TrainSettings(**defaults))


def test_a_search_refits_only_the_candidate_it_keeps(
    tiny_fleet: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import models.training.train as training

    refitted: list[TrainSettings] = []
    real = training.refit_on_everything

    def counted(
        fits: Any, tokenizer: Any, train: Any, validation: Any, settings: TrainSettings, *a: Any, **kw: Any
    ) -> Any:
        refitted.append(settings)
        return real(fits, tokenizer, train, validation, settings, *a, **kw)

    monkeypatch.setattr(training, "refit_on_everything", counted)
    out = tmp_path / "searched"
    settings = TrainSettings(**{**TINY, "search": [{"n_embd": 16}]})
    train(tiny_fleet["telemetry"], tiny_fleet["events"], out, settings, machines=tiny_fleet["machines"])
    meta = json.loads((out / CONFIG_FILE).read_text())
    kept = next(i for i, r in enumerate(meta["training"]["search_results"]) if r["kept"])
    assert len(refitted) == 1 and refitted[0].n_embd == (16 if kept == 1 else TINY["n_embd"])
    assert meta["training"]["refit"]["selected_steps"] == [meta["training"]["search_results"][kept]["step"]]
    assert meta["architecture"]["n_embd"] == refitted[0].n_embd


def test_validation_keeps_its_best_step_and_with_a_tolerance_the_latest_close_to_it(
    tiny_checkpoint: Path, tiny_fleet: dict[str, Path], tmp_path: Path
) -> None:
    plain = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    tolerance = plain["training"]["step_tolerance"]
    assert tolerance == TrainSettings.model_fields["step_tolerance"].default > 0
    validated = [h for h in plain["training"]["history"] if "validation_pr_auc" in h]
    best = max(h["validation_pr_auc"] for h in validated)
    close = [h for h in validated if h["validation_pr_auc"] >= best - tolerance]
    assert plain["step"] == close[-1]["step"]
    assert plain["validation"]["pr_auc"] == close[-1]["validation_pr_auc"]
    # A tolerance as wide as PR-AUC itself: every step is close enough, so the last one validated is chosen.
    out = tmp_path / "tolerant"
    settings = TrainSettings(**{**TINY, "refit": False, "step_tolerance": 0.99})
    train(tiny_fleet["telemetry"], tiny_fleet["events"], out, settings, machines=tiny_fleet["machines"])
    tolerant = json.loads((out / CONFIG_FILE).read_text())
    last = [h for h in tolerant["training"]["history"] if "validation_pr_auc" in h][-1]
    assert tolerant["step"] == last["step"] == TINY["max_steps"]
    assert tolerant["validation"]["pr_auc"] == last["validation_pr_auc"]


@given(
    st.lists(
        st.tuples(st.floats(0, 1), st.floats(0, 5)),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([0.0, 0.005, 0.02, 0.1]),
)
def test_checkpoints_dropped_during_training_could_never_have_been_chosen(
    scores: list[tuple[float, float]], tolerance: float
) -> None:
    from models.training.train import _Checkpoint, _chosen_checkpoint, _within_tolerance

    every = [_Checkpoint(100 * (i + 1), pr_auc, nll, {}) for i, (pr_auc, nll) in enumerate(scores)]
    kept: list[_Checkpoint] = []
    for checkpoint in every:
        kept = _within_tolerance([*kept, checkpoint], tolerance)
    chosen = _chosen_checkpoint(kept, tolerance)
    assert chosen is _chosen_checkpoint(every, tolerance)
    best = max(pr_auc for pr_auc, _ in scores)
    assert chosen.pr_auc >= best - tolerance
    if tolerance > 0:
        assert all(c.step <= chosen.step for c in every if c.pr_auc >= best - tolerance)
    else:  # as before the tolerance: the best PR-AUC, the lower log loss between equals, then earlier
        assert (chosen.pr_auc, -chosen.outcome_nll) == max((c.pr_auc, -c.outcome_nll) for c in every)


def test_the_time_budget_is_shared_by_the_selections_and_one_refit() -> None:
    from models.training.train import selection_minutes

    plain = TrainSettings(**{**TINY, "max_minutes": 12.0})
    assert selection_minutes(plain, 800, 200, 1) == pytest.approx(12 * 800 / 1800)  # T / (2T + V): as before a search
    assert selection_minutes(plain, 800, 200, 2) == pytest.approx(12 * 800 / 2600)  # two selections, one refit
    no_refit = TrainSettings(**{**TINY, "max_minutes": 12.0, "refit": False})
    assert selection_minutes(no_refit, 800, 200, 3) == pytest.approx(4.0)


def test_a_search_names_a_candidate_that_overrides_nothing_or_what_it_cannot() -> None:
    with pytest.raises(
        ValidationError, match=r"search candidate 1 \(\{'blockstats': 2\}\): cannot override blockstats"
    ):
        TrainSettings(**{**TINY, "search": [{"blockstats": 2}]})
    with pytest.raises(ValidationError, match=r"search candidate 2 .*: cannot override max_minutes"):
        TrainSettings(**{**TINY, "search": [{"blocks": 2}, {"max_minutes": 1}]})
    with pytest.raises(ValidationError, match=r"search candidate 1 .*: overrides nothing"):
        TrainSettings(**{**TINY, "search": [{}]})


def test_split_has_no_leakage(tiny_fleet: dict[str, Path]) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"])
    spec = WindowSpec(window_h=12, horizon_h=12)
    split = choose_split(fleet, 12, min_failures=3)
    train_windows, validation_windows = split_windows(fleet, spec, split)
    assert max(w.end_s for w in train_windows) < split.validation_from_s <= min(w.end_s for w in validation_windows)
    # every training label is decided by what happened before the validation period starts
    for w in train_windows:
        assert w.end_s + 12 * 3600 <= split.validation_from_s or (
            w.failed
            and w.hours_to_failure is not None
            and w.end_s + w.hours_to_failure * 3600 < split.validation_from_s
        )
    assert sum(w.failed for w in validation_windows) > 0


def test_any_local_causal_lm_folder_can_be_the_backbone(tiny_fleet: dict[str, Path], tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    backbone_dir = tmp_path / "llama-mini"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    ).save_pretrained(backbone_dir)
    out = tmp_path / "model"
    train(
        tiny_fleet["telemetry"],
        tiny_fleet["events"],
        out,
        TrainSettings(**{**TINY, "max_steps": 10, "eval_every": 10, "backbone": backbone_dir}),
        machines=tiny_fleet["machines"],
    )
    model, tokenizer, meta = load_checkpoint(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.get_input_embeddings().num_embeddings == tokenizer.vocab_size
    assert meta.backbone == str(backbone_dir)
    assert load_backbone(backbone_dir, vocab_size=77).get_input_embeddings().num_embeddings == 77


def test_load_backbone_names_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_backbone(tmp_path)


@pytest.mark.parametrize("n_positions", [64, 128, 256])
def test_default_model_is_small_and_runs_at_each_context_length(n_positions: int) -> None:
    model = build_model(ModelConfig(vocab_size=1000, n_positions=n_positions))
    assert 100_000 < count_parameters(model) < 1_000_000  # the small default: ~0.17 M with 1,000 tokens
    ids = torch.randint(0, 1000, (2, n_positions))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert logits.shape == (2, n_positions, 1000)


def test_the_fused_gelu_computes_gpt2s_tanh_gelu() -> None:
    """Training uses the one-kernel tanh GELU for speed; a model saved with it must score as GPT-2's "gelu_new" does
    with the same weights (older checkpoints say "gelu_new", and the export writes FastGelu for both)."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    fused = build_model(ModelConfig(vocab_size=50, n_positions=32, n_embd=16, n_head=2, n_layer=2)).eval()
    assert fused.config.activation_function == "gelu_pytorch_tanh"
    config = fused.config.to_dict() | {"activation_function": "gelu_new"}
    classic = GPT2LMHeadModel(type(fused.config).from_dict(config)).eval()
    classic.load_state_dict(fused.state_dict())
    ids = torch.randint(0, 50, (3, 32))
    with torch.no_grad():
        a = fused(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        b = classic(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.allclose(a, b, atol=1e-5)
    x = torch.linspace(-8, 8, 1001)
    assert torch.allclose(fused.transformer.h[0].mlp.act(x), classic.transformer.h[0].mlp.act(x), atol=1e-6)
    erf_gelu = torch.nn.functional.gelu(x)
    assert not torch.allclose(fused.transformer.h[0].mlp.act(x), erf_gelu, atol=1e-6)  # the tanh GELU, not the erf


@pytest.mark.parametrize("value_channel", [False, True])
def test_the_output_layer_on_picked_hidden_states_gives_the_models_logits_there(value_channel: bool) -> None:
    """Training and validation read logits where a loss reads them: ``head(hidden[rows, cols])`` must be the model's
    own ``logits[rows, cols]``, with and without the value channel, padding and all; and a model that is not our
    GPT-2 gives its logits and the identity, so a backbone still trains."""
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(vocab_size=40, n_positions=16, n_embd=16, n_head=2, n_layer=2, value_channel=value_channel)
    ).eval()
    ids = torch.randint(3, 40, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding, as pack_sequences makes it
    values = torch.randn(3, 12) if value_channel else None
    extra = {} if values is None else {"values": values}
    rows, cols = torch.tensor([0, 1, 2, 2]), torch.tensor([11, 6, 0, 5])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, **extra).logits
        hidden, head = hidden_and_head(model, ids, mask, values)
        picked = head(hidden[rows, cols])
    assert hidden.shape == (3, 12, 16)
    assert torch.allclose(picked, logits[rows, cols], atol=1e-6)
    if value_channel:  # the values reach the hidden states: other values, other logits
        with torch.no_grad():
            other, _ = hidden_and_head(model, ids, mask, values + 1.0)
        assert not torch.allclose(head(other[rows, cols]), picked, atol=1e-3)

    class Wrapped(torch.nn.Module):  # any causal LM: ids + mask -> logits
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    with torch.no_grad():
        whole, same = hidden_and_head(Wrapped(), ids, mask, values)
    assert whole.shape == (3, 12, 40) and torch.equal(same(whole), whole)
    assert torch.allclose(whole, logits, atol=1e-6)


def test_model_config_rejects_a_bad_shape() -> None:
    with pytest.raises(ValueError, match="n_embd=100 must be a multiple of n_head=3"):
        ModelConfig(vocab_size=10, n_embd=100, n_head=3)


def test_auxiliary_loss_counts_only_window_tokens(tiny_fleet: dict[str, Path]) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[:8]
    tokenizer = TelemetryTokenizer(TrainSettings(**TINY).tokenizer)
    tokenizer.fit([w.window for w in windows], [w.outcome for w in windows])
    encoded = EncodedWindows.of(tokenizer, windows)
    b0 = tokenizer.tokens(windows[0].window).index("<b0>")
    assert encoded.body_start.tolist() == [b0] * 8  # the context has the same length in every window here
    packed = pack_sequences(encoded.ids, tokenizer.pad_id, 64)
    wanted = auxiliary_targets(encoded, packed.last_index, packed.input_ids.shape[1])
    for row, ids in enumerate(encoded.ids):
        targets = np.flatnonzero(wanted[row]) + 1
        assert targets.tolist() == list(range(b0 + 1, len(ids)))  # every body token after <b0>, up to the horizon

    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, n_positions=65, n_embd=16, n_head=2, n_layer=1))
    model.eval()  # no dropout: the calls below must see the same network
    full = sequence_loss(model, encoded, tokenizer.pad_id, 65, aux_loss_weight=0.5, followup_loss_weight=0.25)
    assert full.total.item() == pytest.approx(full.outcome + 0.25 * full.followup + 0.5 * full.body, rel=1e-5)
    bare = sequence_loss(model, encoded, tokenizer.pad_id, 65, aux_loss_weight=0.0)
    assert bare.total.item() == pytest.approx(full.outcome, rel=1e-5)
    assert bare.body == bare.followup == 0.0
    # no room after the longest sequence: the answer is not fed, the outcome loss is the same
    no_room = sequence_loss(
        model, encoded, tokenizer.pad_id, max(map(len, encoded.ids)), aux_loss_weight=0.0, followup_loss_weight=0.25
    )
    assert no_room.followup == 0.0 and no_room.outcome == pytest.approx(full.outcome, rel=1e-5)


def test_outcome_loss_splits_whether_a_failure_comes_from_which_kind() -> None:
    # Vocabulary: 0 <ok>, 1 <failure:a>, 2 <failure:b>, 3 some other token.
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.3], [0.1, 1.5, 0.2, -0.4], [0.0, -2.0, 1.0, 0.5]])
    targets = torch.tensor([0, 1, 1])
    failed = torch.tensor([False, True, True])
    plain = F.cross_entropy(logits, targets)
    assert outcome_nll(logits, targets, failed, [1, 2], 1.0).item() == pytest.approx(plain.item(), rel=1e-6)
    assert outcome_nll(logits, targets, failed, [], 0.0).item() == pytest.approx(plain.item(), rel=1e-6)
    # At weight 0 only whether a failure comes counts: moving mass between the kinds changes nothing ...
    swapped = logits[:, [0, 2, 1, 3]]
    assert outcome_nll(swapped, targets, failed, [1, 2], 0.0).item() == pytest.approx(
        outcome_nll(logits, targets, failed, [1, 2], 0.0).item(), rel=1e-6
    )
    # ... while the kind term does see it: the third window named the wrong kind, and swapping fixes that.
    assert outcome_nll(swapped, targets, failed, [1, 2], 0.25) < outcome_nll(logits, targets, failed, [1, 2], 0.25)
    p = torch.softmax(logits, dim=-1)
    whether = -torch.log(torch.stack([p[0, 0], p[1, 1] + p[1, 2], p[2, 1] + p[2, 2]]))
    which = -torch.log(torch.stack([p[1, 1] / (p[1, 1] + p[1, 2]), p[2, 1] / (p[2, 1] + p[2, 2])]))
    expected = (whether.sum() + 0.25 * which.sum()) / 3
    assert outcome_nll(logits, targets, failed, [1, 2], 0.25).item() == pytest.approx(expected.item(), rel=1e-6)


def test_time_to_failure_buckets_are_fractions_of_the_horizon(tiny_fleet: dict[str, Path]) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[:20]
    tokenizer = TelemetryTokenizer(TrainSettings(**TINY).tokenizer)
    tokenizer.fit([w.window for w in windows], [w.outcome for w in windows])
    buckets = [tokenizer.time_to_failure_token(h) for h in (0.0, 2.9, 3.0, 11.9, 12.0, 30.0, 48.0, 500.0, None)]
    assert buckets == [
        "<next:0>",
        "<next:0>",
        "<next:1>",
        "<next:3>",
        "<next:4>",
        "<next:5>",
        "<next:6>",
        "<next:6>",
        "<next:?>",
    ]


def test_token_dropout_hides_only_sensor_readings(tiny_fleet: dict[str, Path]) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[:16]
    tokenizer = TelemetryTokenizer(TrainSettings(**TINY).tokenizer)
    tokenizer.fit([w.window for w in windows], outcomes=[w.outcome for w in windows])
    encoded = EncodedWindows.of(tokenizer, windows)
    missing = tokenizer.missing_ids()
    full = windows[-1].window  # 12 hourly readings: its first block has a reading of every sensor
    first_reading = tokenizer.encode(full)[tokenizer.tokens(full).index("<b0>") + 1]
    assert tokenizer.decode([missing[first_reading]])[0].endswith(":mean_")
    assert missing[missing[first_reading]] == -1  # a missing token stays as it is
    assert missing[tokenizer.horizon_id] == -1
    rng = np.random.default_rng(0)
    assert hide_readings(encoded, missing, 0.0, rng) is encoded
    hidden = hide_readings(encoded, missing, 0.5, rng)
    changed = 0
    for before, after in zip(encoded.ids, hidden.ids, strict=True):
        assert len(before) == len(after)
        for a, b in zip(before, after, strict=True):
            if a != b:
                changed += 1
                assert missing[a] == b  # a reading became that sensor's "missing" token, nothing else changed
    readings = sum(int((missing[np.asarray(s)] >= 0).sum()) for s in encoded.ids)
    assert 0.3 * readings < changed < 0.7 * readings
    assert hidden.targets is encoded.targets


def test_training_device_is_chosen_on_purpose() -> None:
    assert training_device("cpu").type == "cpu"
    assert training_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        assert training_device("cuda:0").type == "cuda"
    else:
        with pytest.raises(ValueError, match="torch sees no CUDA GPU here"):
            training_device("cuda")
    with pytest.raises(ValidationError, match="device"):
        TrainSettings(horizon_h=24, device="gpu")


def test_bin_tokens_start_in_order_along_a_line(tiny_fleet: dict[str, Path]) -> None:
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))
    tokenizer = TelemetryTokenizer(TrainSettings(**TINY).tokenizer)
    tokenizer.fit([w.window for w in windows], outcomes=[w.outcome for w in windows])
    families = tokenizer.ordinal_families()
    names = [tokenizer.decode(f) for f in families]
    # Every sensor statistic's bins, low to high, then the age bins; no "missing" token is in any family.
    first = names[0]
    bins = TrainSettings(**TINY).tokenizer.bins
    assert first == [f"{first[0][:-2]}{b:02d}" for b in range(bins)]
    assert any(n[0].startswith("lastfail#a00") for n in names)
    assert not any(t.endswith("_") or t.endswith("=never") for n in names for t in n)
    assert len({i for f in families for i in f}) == sum(len(f) for f in families)  # no token in two families

    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=1, n_head=2))
    init_ordinal_embeddings(model, families, generator=torch.Generator().manual_seed(0))
    weight = model.get_input_embeddings().weight.detach()
    for family in families[:5]:
        rows = weight[family]
        # The projection on the family's direction rises from the lowest bin to the highest.
        direction = rows[-1] - rows[0]
        projection = (rows @ direction).numpy()
        assert np.corrcoef(np.arange(len(family)), projection)[0, 1] > 0.9
    # Neighbouring bins start closer than random tokens do.
    family = families[0]
    neighbour = float(torch.linalg.norm(weight[family[1]] - weight[family[0]]))
    assert neighbour < float(torch.linalg.norm(weight[family[0]] - weight[tokenizer.horizon_id]))


def test_every_model_config_field_reaches_the_model_and_nothing_else_does() -> None:
    """build_model maps ModelConfig field by field: each field changed from its default changes the built model's
    config (or its class), so a field added later without a mapping fails here instead of being ignored."""
    import dataclasses

    from models.training.model import ModelConfig, ValueGPT2LMHeadModel, build_model

    base = ModelConfig(vocab_size=40, n_positions=24, n_embd=16, n_layer=1, n_head=2)
    built = build_model(base)
    assert (built.config.n_embd, built.config.n_layer, built.config.n_head, built.config.n_positions) == (16, 1, 2, 24)
    assert built.config.resid_pdrop == built.config.embd_pdrop == built.config.attn_pdrop == base.dropout
    changed = {"vocab_size": 41, "n_positions": 25, "n_embd": 32, "n_layer": 2, "n_head": 4, "dropout": 0.2,
               "attention_dropout": 0.0, "pad_token_id": 5, "bos_token_id": 6, "value_channel": True}  # fmt: skip
    assert set(changed) == {f.name for f in dataclasses.fields(ModelConfig)}
    for name, value in changed.items():
        other = build_model(dataclasses.replace(base, **{name: value}))
        assert other.config.to_dict() != built.config.to_dict() or type(other) is not type(built), name
    assert isinstance(build_model(dataclasses.replace(base, value_channel=True)), ValueGPT2LMHeadModel)
    no_attention_dropout = build_model(dataclasses.replace(base, attention_dropout=0.0)).config
    assert (no_attention_dropout.attn_pdrop, no_attention_dropout.resid_pdrop) == (0.0, base.dropout)


def test_a_fleet_of_many_sensors_gets_fewer_blocks_instead_of_an_error(tiny_fleet: dict[str, Path]) -> None:
    """Blocks are a default, not a fact of the data: where the sensors make a sequence's fixed part longer than
    max_length, training cuts windows into the most blocks that leave room for events, and says so."""
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    windows = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[:300]
    base = {k: v for k, v in TINY.items() if k != "max_length"}
    full = TelemetryTokenizer(TrainSettings(**base).tokenizer)
    full.fit([w.window for w in windows])
    assert full.settings.blocks == 4
    max_length = full.fixed_length - 1  # four blocks no longer fit
    settings = TrainSettings(**base, max_length=max_length)
    with pytest.raises(SequenceTooLongError) as raised:
        fitted_tokenizer(settings, windows)
    sensors, context = raised.value.sensors, raised.value.context
    assert fixed_length_of(sensors, context, full.settings) == full.fixed_length

    changed, tokenizer, record = tokenizer_that_fits(settings, windows)
    room = max_length - min(EVENT_ROOM, max_length // 4)  # what is left for the fixed part
    chosen = changed.tokenizer.blocks
    assert record == {"sensors": sensors, "fixed_length": tokenizer.fixed_length, "blocks": chosen}
    assert 1 <= chosen < 4 and tokenizer.settings.blocks == chosen and tokenizer.fixed_length <= room
    one_more = changed.tokenizer.model_copy(update={"blocks": chosen + 1})
    assert chosen == 3 or fixed_length_of(sensors, context, one_more) > room  # the most blocks that fit
    assert changed.model_copy(update={"tokenizer": settings.tokenizer}) == settings  # nothing else changed

    # At one block, one window statistic; where even that does not fit, the error stands.
    one_block = fixed_length_of(sensors, context, settings.tokenizer.model_copy(update={"blocks": 1}))

    def room_of(length: int) -> int:
        return length - min(EVENT_ROOM, length // 4)

    tight = next(m for m in range(8, 4 * one_block) if room_of(m) >= one_block - sensors)  # one statistic less fits
    assert room_of(tight) < one_block
    changed, tokenizer, record = tokenizer_that_fits(TrainSettings(**base, max_length=tight), windows)
    assert record is not None and record["blocks"] == 1 and record["window_stats"] == ("slope",)
    assert changed.tokenizer.window_stats == ("slope",) and tokenizer.fixed_length == one_block - sensors
    with pytest.raises(SequenceTooLongError):
        tokenizer_that_fits(TrainSettings(**base, max_length=one_block - sensors - 1), windows)
    # Blocks named are kept: the error names the fix.
    with pytest.raises(SequenceTooLongError, match="use fewer blocks"):
        tokenizer_that_fits(TrainSettings(**base, max_length=max_length, blocks=4), windows)
    # Where four blocks fit, nothing changes.
    assert tokenizer_that_fits(TrainSettings(**base), windows)[2] is None


def test_a_model_trained_with_fewer_blocks_scores_at_the_edge_with_them(
    tiny_fleet: dict[str, Path], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    base = {k: v for k, v in TINY.items() if k not in ("max_length", "max_steps", "eval_every")}
    max_length = TelemetryTokenizer.load(tiny_checkpoint).fixed_length - 1
    settings = TrainSettings(**base, max_length=max_length, max_steps=10, eval_every=5)
    result, keys = train_signed(tiny_fleet, settings, tmp_path)
    recorded = json.loads((tmp_path / "artifact" / CONFIG_FILE).read_text())["training"]
    blocks = recorded["fitted_to_length"]["blocks"]
    assert blocks < 4 and recorded["tokenizer"]["blocks"] == blocks
    from models.edge.runtime import LMScorer  # the edge's path: the signature first, then the int8 graph
    from models.edge.signing import load_public_keys

    scorer = LMScorer.load(tmp_path / "artifact", load_public_keys(keys / "precursor.pub"))
    fleet = Fleet.load(tiny_fleet["telemetry"], tiny_fleet["events"], tiny_fleet["machines"])
    window = build_windows(fleet, WindowSpec(window_h=12, horizon_h=12))[-1].window
    risk = scorer.score(window)
    assert risk and all(0.0 <= p <= 1.0 for p in risk.values())
    assert TelemetryTokenizer.load(result.checkpoint_dir).settings.blocks == blocks
