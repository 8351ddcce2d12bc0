"""The telemetry language model: a small causal transformer, its checkpoint folder, and a torch scorer.

Built from a plain :class:`ModelConfig` with ``transformers`` (GPT-2 blocks: learned absolute positions, pre-norm,
GELU MLP); nothing is downloaded. Any local Hugging Face causal-LM checkpoint folder can be the backbone instead
(:func:`load_backbone`): its embeddings are resized to the tokenizer's vocabulary.

A checkpoint folder holds the Hugging Face ``save_pretrained`` files, the tokenizer files and ``precursor.json``
(:class:`CheckpointMeta`: architecture, training arguments, step, best validation metric, horizon, the alert
threshold chosen on validation, how windows are cut, and which data trained it), so loading rebuilds the exact model.

The forward contract everywhere (torch, ONNX, edge): ``input_ids`` and ``attention_mask`` ``(B, L)`` int64, right
padded, in; ``logits`` ``(B, L, V)`` out; the risk is read at each sequence's last real position
(:mod:`models.edge.outcome`). Training builds the model with one position more than the tokenizer's ``max_length``: it
feeds the outcome token after the horizon token to ask for the time to failure. ``precursor.json`` records the
scoring context (``context_length``, the tokenizer's ``max_length``) and the ``outcome_tokens``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from models.edge.calibration import IDENTITY, Calibration, calibration_of
from models.edge.outcome import pack_sequences, risks_from_logits
from models.edge.registry import CONFIG_FILE
from models.edge.scoring import Risk, Window
from models.edge.tokenizer import TelemetryTokenizer

MAX_DEFAULT_PARAMETERS = 10_000_000


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, as plain data: everything needed to rebuild the model.

    The default (2 layers of width 64, 2 heads) has about 0.15 M parameters with a vocabulary of ~900 tokens: it trains
    in minutes on one CPU core and scores a window in well under a millisecond at the edge. It was picked from a
    quality/latency table of three sizes (BENCHMARKS.md): on C-MAPSS FD001 the larger ones were no better beyond the
    spread between seeds, and only this one met the edge's throughput targets with room to spare. Two heads of 32
    rather than four of 16: the fused attention kernel is most of the edge's time and costs per head, and two heads
    scored as well on FD001 (0.924 and 0.933 test PR-AUC against 0.920-0.933) at 1.6x the int8 throughput.
    """

    vocab_size: int
    n_positions: int = 256
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 2
    dropout: float = 0.1
    attention_dropout: float | None = None
    """Dropout on the attention weights; None: ``dropout``, as GPT-2 has it."""
    pad_token_id: int = 0
    bos_token_id: int = 2
    value_channel: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        for name in ("dropout", "attention_dropout"):
            rate = getattr(self, name)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ValueError(f"{name}={rate} must be in [0, 1)")


class ValueGPT2LMHeadModel(GPT2LMHeadModel):
    """GPT-2 with a value channel: each token's embedding plus its value times a direction of its own.

    ``embedding(token, value) = wte[token] + value * wve[token]``: for a bin token, a line through its bin's embedding,
    so the model reads where in the bin a statistic lies (the tail bins are open-ended, and a failure's readings sit
    there). Values come from :meth:`models.edge.tokenizer.TelemetryTokenizer.encode_with_values`; tokens without one
    carry 0, and so does every token when ``values`` is not given. The forward contract gains ``values`` ``(B, L)``
    float.
    """

    def __init__(self, config: GPT2Config) -> None:
        super().__init__(config)
        self.value_embedding = torch.nn.Embedding(config.vocab_size, config.n_embd)
        torch.nn.init.normal_(self.value_embedding.weight, std=config.initializer_range)

    def embed(self, input_ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The input embeddings ``(B, L, C)`` of ids ``(B, L)`` with their values ``(B, L)``."""
        wte = self.transformer.wte(input_ids)
        return wte + self.value_embedding(input_ids) * values.unsqueeze(-1).to(wte.dtype)

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor | None = None, values: torch.Tensor | None = None, **kwargs: Any
    ) -> Any:
        if values is not None and input_ids is not None:
            kwargs["inputs_embeds"] = self.embed(input_ids, values)
            input_ids = None
        return super().forward(input_ids=input_ids, **kwargs)


def takes_values(model: torch.nn.Module) -> bool:
    """Whether the model has a value channel (:class:`ValueGPT2LMHeadModel`)."""
    return bool(getattr(getattr(model, "config", None), "value_channel", False))


def build_model(config: ModelConfig) -> GPT2LMHeadModel:
    """A fresh GPT-2-style causal LM with the given shape (random weights, no hub); with ``value_channel``, a
    :class:`ValueGPT2LMHeadModel`."""
    # Field by field: GPT2Config keeps any keyword it is given, so a field added to ModelConfig later must be mapped
    # here on purpose rather than flow into the model's config unnoticed.
    hf_config = GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout if config.attention_dropout is None else config.attention_dropout,
        eos_token_id=None,
        tie_word_embeddings=True,
        # GPT-2's tanh GELU as one fused kernel: the same function as "gelu_new" (which builds it from eight tensor ops,
        # each kept for the backward pass), at two thirds of the training step's time on one CPU thread
        # (BENCHMARKS.md, "A fused GELU"). The export writes FastGelu for either.
        activation_function="gelu_pytorch_tanh",
    )
    if config.value_channel:  # ours: it picks the model class
        hf_config.value_channel = True
        return ValueGPT2LMHeadModel(hf_config)
    return GPT2LMHeadModel(hf_config)


MEMBER_PREFIX = "member-"
"""An ensemble checkpoint's member sub-folders are ``member-0``, ``member-1``, ..."""


class EnsembleLM(torch.nn.Module):
    """Several causal LMs over one tokenizer, read as one: the next-token distribution is the mean of theirs.

    ``logits = log(mean_i softmax(logits_i))``: already normalised, so whatever reads the risk from a softmax of
    ``logits`` (:mod:`models.edge.outcome`, the edge) gets the members' mean probabilities without knowing there are
    several. The risk, renormalised over the outcome tokens, is then the members' risks averaged with weights their
    mass on those tokens (nearly all of it, after the horizon token). Why: members trained from different seeds on a
    small fleet disagree on its rare failures, and averaging them ranks windows better than any one (BENCHMARKS.md).
    Saved as one sub-folder per member (``member-0``, ...).
    """

    def __init__(self, members: Sequence[PreTrainedModel]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        vocab = {m.get_output_embeddings().weight.shape[0] for m in members}
        if len(vocab) != 1:
            raise ValueError(f"ensemble members disagree on the vocabulary size: {sorted(vocab)}")
        self.members = torch.nn.ModuleList(members)

    @property
    def config(self) -> Any:
        """The first member's: the members share a tokenizer, a context and (from training) an architecture."""
        return self.members[0].config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.members[0].get_output_embeddings()

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> CausalLMOutput:
        log_probs = torch.stack(
            [torch.log_softmax(m(input_ids=input_ids, **kwargs).logits.float(), dim=-1) for m in self.members]
        )  # (M, B, L, V)
        return CausalLMOutput(logits=torch.logsumexp(log_probs, dim=0) - math.log(len(self.members)))

    def save_pretrained(self, directory: str | Path) -> None:
        for i, member in enumerate(self.members):
            member.save_pretrained(Path(directory) / f"{MEMBER_PREFIX}{i}")


def member_folders(directory: str | Path) -> list[Path]:
    """The member sub-folders of an ensemble checkpoint, in order; empty for a single model."""
    found = {}
    for path in Path(directory).glob(f"{MEMBER_PREFIX}*"):
        index = path.name.removeprefix(MEMBER_PREFIX)
        if index.isdigit() and (path / "config.json").is_file():
            found[int(index)] = path
    if found and sorted(found) != list(range(len(found))):
        raise ValueError(f"{directory}: ensemble members {sorted(found)} are not numbered 0..{len(found) - 1}")
    return [found[i] for i in sorted(found)]


def ensemble_members(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The models an ensemble averages, or the model alone."""
    return list(model.members) if isinstance(model, EnsembleLM) else [model]


def load_causal_lm(directory: str | Path, **kwargs: Any) -> PreTrainedModel:
    """A saved causal LM: an ensemble from its member folders (:class:`EnsembleLM`), ours with a value channel as
    :class:`ValueGPT2LMHeadModel` (transformers' auto classes would build plain GPT-2 and drop the value table with
    only a warning), any other through ``AutoModelForCausalLM``."""
    members = member_folders(directory)
    if members:
        return EnsembleLM([load_causal_lm(path, **kwargs) for path in members])  # type: ignore[return-value]
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if getattr(config, "value_channel", False):
        return ValueGPT2LMHeadModel.from_pretrained(directory, config=config, local_files_only=True, **kwargs)
    return AutoModelForCausalLM.from_pretrained(directory, config=config, local_files_only=True, **kwargs)


def init_ordinal_embeddings(
    model: PreTrainedModel, families: Sequence[Sequence[int]], *, generator: torch.Generator | None = None
) -> None:
    """Start each family of ordered bin tokens on a line through embedding space: ``a + t * b`` plus a little noise,
    with ``t`` from -1 (lowest bin) to 1 (highest) and ``a``, ``b`` drawn like GPT-2's own initial weights.

    Why: a random start treats "bin 7" and "bin 8" as unrelated words, and training must learn their order from
    data, which fails for tail bins that few windows reach (exactly where failures live). On a line, a tail bin
    starts as an extrapolation of its neighbours. Only the start changes: the model and its export are the same.
    """
    weight = model.get_input_embeddings().weight
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        for ids in families:
            if len(ids) < 2:
                continue
            index = torch.as_tensor(list(ids), dtype=torch.long, device=weight.device)
            t = torch.linspace(-1.0, 1.0, len(ids), device=weight.device)[:, None]
            a, b = (torch.randn(2, 1, weight.shape[1], generator=generator) * std).to(weight.device)
            noise = torch.randn(len(ids), weight.shape[1], generator=generator).to(weight.device) * std * 0.5
            weight[index] = (a + t * b + noise).to(weight.dtype)


def load_backbone(directory: str | Path, vocab_size: int | None = None) -> PreTrainedModel:
    """Any local Hugging Face causal-LM checkpoint folder; with ``vocab_size``, its embeddings resized to it.

    New embedding rows start random: the telemetry tokens are new words to any text model.
    """
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: not a Hugging Face checkpoint folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    if vocab_size is not None and model.get_input_embeddings().num_embeddings != vocab_size:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def context_length(model: torch.nn.Module, declared: int | None = None) -> int:
    """The longest token sequence the model takes: the smallest of its position table and ``declared`` (a checkpoint's
    own limit, ``context_length`` in ``precursor.json``); large for a model with neither."""
    config = getattr(model, "config", None)
    limits = [getattr(config, name, None) for name in ("n_positions", "max_position_embeddings", "n_ctx", "block_size")]
    found = [int(v) for v in (*limits, declared) if isinstance(v, int) and v > 0]
    return min(found) if found else 1 << 16


# --- checkpoint folder --------------------------------------------------------------------------------------------


class CheckpointMeta(BaseModel):
    """What ``precursor.json`` says about a checkpoint."""

    model_config = ConfigDict(extra="allow")

    format: str = "precursor-checkpoint/1"
    model_name: str = "precursor-lm"
    architecture: dict[str, Any] | None = Field(None, description="ModelConfig fields; None when a backbone was used")
    backbone: str | None = None
    parameters: int
    members: int = Field(1, description="models averaged (EnsembleLM), one sub-folder each when more than 1")
    horizon_h: float
    threshold: float = Field(description="alert when risk['failure'] >= threshold; chosen on validation")
    window: dict[str, Any] = Field(description="how windows are cut: window_h, every_h, min_points, event_lookback_h")
    tokenizer_hash: str
    training: dict[str, Any] = Field(default_factory=dict, description="training settings, seed, time taken")
    step: int = 0
    validation: dict[str, Any] = Field(default_factory=dict, description="best validation metrics (chose the step)")
    data: dict[str, Any] = Field(default_factory=dict, description="training files and time split")
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())


def save_checkpoint(
    directory: str | Path, model: PreTrainedModel, tokenizer: TelemetryTokenizer, meta: CheckpointMeta
) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save(directory)
    (directory / CONFIG_FILE).write_text(meta.model_dump_json(indent=1) + "\n")
    return directory


def read_meta(directory: str | Path) -> CheckpointMeta:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a model folder has {CONFIG_FILE})")
    return CheckpointMeta.model_validate(json.loads(path.read_text()))


def load_checkpoint(directory: str | Path) -> tuple[PreTrainedModel, TelemetryTokenizer, CheckpointMeta]:
    directory = Path(directory)
    meta = read_meta(directory)
    tokenizer = TelemetryTokenizer.load(directory)
    if tokenizer.content_hash != meta.tokenizer_hash:
        raise ValueError(
            f"{directory}: tokenizer hash {tokenizer.content_hash[:12]} differs from the one the model was trained "
            f"with ({meta.tokenizer_hash[:12]})"
        )
    model = load_causal_lm(directory)
    model.eval()
    return model, tokenizer, meta


def model_config_dict(config: ModelConfig) -> dict[str, Any]:
    return asdict(config)


# --- scoring with torch -------------------------------------------------------------------------------------------


def hidden_and_head(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The model's last hidden states ``(B, L, C)`` and the output layer that turns any picked ones into logits.

    Why: training and validation read logits at some positions only. Computing them at every position and indexing
    the ``(B, L, V)`` result fills and copies tensors of that size in the backward pass: about a fifth of a training
    step on one CPU thread (BENCHMARKS.md, "The output layer where the loss reads it"). ``head(hidden[rows, cols])``
    is the model's ``logits[rows, cols]``. Our GPT-2 only (its forward is the transformer, then ``lm_head``); any
    other model gives its logits and the identity.
    """
    if isinstance(model, GPT2LMHeadModel):
        embeds = None
        if values is not None and isinstance(model, ValueGPT2LMHeadModel):
            embeds = model.embed(input_ids, values)
        hidden = model.transformer(
            input_ids=None if embeds is not None else input_ids,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            use_cache=False,
        ).last_hidden_state
        return hidden, model.lm_head
    extra = {} if values is None else {"values": values}
    return model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits, _same


def _same(logits: torch.Tensor) -> torch.Tensor:
    return logits


@torch.no_grad()
def last_logits(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    batch_size: int = 256,
    *,
    values: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Logits ``(N, V)`` at each sequence's last token: the next-token distribution after the horizon token.

    ``values``, beside the ids, for a model with a value channel."""
    was_training = model.training
    model.eval()
    limit = context_length(model)
    out = []
    for i in range(0, len(sequences), batch_size):
        part = None if values is None else values[i : i + batch_size]
        batch = pack_sequences(sequences[i : i + batch_size], pad_id=pad_id, max_length=limit, values=part)
        hidden, head = hidden_and_head(
            model,
            torch.from_numpy(batch.input_ids).to(model.device),
            torch.from_numpy(batch.attention_mask).to(model.device),
            None if batch.values is None else torch.from_numpy(batch.values).to(model.device),
        )
        index = torch.from_numpy(batch.last_index).to(model.device)
        out.append(head(hidden[torch.arange(len(index), device=model.device), index]).float().cpu().numpy())  # (B, V)
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


@dataclass
class TorchScorer:
    """The checkpoint scored with torch (cloud side; the edge runs the ONNX export instead)."""

    model: PreTrainedModel
    tokenizer: TelemetryTokenizer
    horizon_h: float
    name: str = "precursor-lm"
    version: str = "dev"
    calibration: Calibration = IDENTITY
    """The checkpoint's calibration map (models.edge.calibration), applied as the edge runtime applies it."""

    @classmethod
    def load(cls, directory: str | Path) -> TorchScorer:
        model, tokenizer, meta = load_checkpoint(directory)
        calibration = calibration_of(meta.model_dump())
        return cls(model, tokenizer, meta.horizon_h, meta.model_name, meta.tokenizer_hash[:12], calibration)

    def score(self, window: Window) -> Risk:
        return self.score_many([window])[0]

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        if not windows:
            return []
        if takes_values(self.model):
            encoded = self.tokenizer.encode_with_values(windows)
            logits = last_logits(self.model, encoded.ids, self.tokenizer.pad_id, values=encoded.values)
        else:
            logits = last_logits(self.model, self.tokenizer.encode_many(windows), self.tokenizer.pad_id)
        return self.calibration.apply_many(risks_from_logits(logits, self.tokenizer.outcome_tokens))
