"""Training the telemetry language model: windows -> tokens -> a small causal transformer, chosen on validation.

The recipe (nanoGPT's habits, as importable functions rather than a script):

1. Cut labelled windows from the generic files and split them in time (:mod:`models.training.dataset`): the validation
   period at the end holds several failures; training labels are known before it starts.
2. Fit the tokenizer on training windows only, encode every window (the sequence ends with the horizon token).
3. Train with AdamW on next-token losses: the outcome token after the horizon token (``<ok>`` / ``<failure:...>``),
   as whether a failure comes plus which kind (weighted by ``kind_loss_weight``);
   then, with the outcome fed in, the token after it: the time to the machine's next failure in buckets of the
   horizon (``<next:B>``, weighted by ``followup_loss_weight``), so the model learns how near a failure is and not
   only which side of the horizon it falls; and, weighted by ``aux_loss_weight``, the window's own tokens after the
   context (each block's sensor tokens predicted from the ones before). Failures are rare: both extra targets give
   every window, failed or not, more to learn from. Scoring reads only the outcome distribution. With
   ``teacher_weight``, whether a failure comes is also learned against gradient boosting's out-of-fold risk of each
   window (:mod:`models.training.teacher`), a graded target where the labels give only 0 or 1.
4. Every ``eval_every`` steps, score the validation windows; keep the step with the best validation PR-AUC (with
   ``step_tolerance``, the latest step within that much of the best).
5. Choose the alert threshold on validation (best F1), fit the calibration map on validation's risks
   (:mod:`models.edge.calibration`) and express the threshold on its scale, write the checkpoint folder, and, given a
   signing key, export the signed int8 ONNX artifact (:mod:`models.training.export`).
   With ``refit``, the model saved in step 5 is first trained again from the same start on training and validation
   windows together for the chosen step's worth of epochs (:func:`refit_on_everything`); the threshold and calibration
   stay the ones chosen on validation.
6. With ``search`` (a list of setting overrides), steps 2 to 5 run once for the settings as given and once for each
   variant, on the same windows from the same seed, and the candidate with the best validation PR-AUC is the one saved
   (:func:`search_candidates`). Only the kept candidate is refitted: a refit costs about a selection run again.
   By default the search is :data:`DEFAULT_SEARCH` (block slopes), where the data is small enough to pay for a second
   selection run (:func:`search_variants`).

Torch uses ``threads`` CPU threads, 1 by default: the quality suite's workers, the flows and the tests train beside
other work, where a second thread spin-waits whenever its core is busy. ``precursor train`` on its own takes the
cores it may use, at most 2 (:func:`available_threads`): on the 2-core box two threads ran FD004's 600 selection steps
in 186 s against 282 s (BENCHMARKS.md, "Two threads for a training on its own").
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.optim.swa_utils import AveragedModel
from transformers import PreTrainedModel

from models.edge.calibration import (
    Calibration,
    brier_score,
    expected_calibration_error,
    fit_platt,
    log_loss,
    reliability_bins,
)
from models.edge.outcome import outcome_probabilities, pack_sequences
from models.edge.tokenizer import SequenceTooLongError, TelemetryTokenizer, TokenizerSettings, fixed_length_of
from models.training.dataset import (
    DatasetError,
    Fleet,
    LabeledWindow,
    MachineSplit,
    WindowSpec,
    choose_validation,
    outcome_counts,
    split_windows,
)
from models.training.evaluate import average_precision, best_f1_threshold, precision_recall_f1
from models.training.model import (
    MAX_DEFAULT_PARAMETERS,
    CheckpointMeta,
    EnsembleLM,
    ModelConfig,
    build_model,
    context_length,
    count_parameters,
    hidden_and_head,
    init_ordinal_embeddings,
    last_logits,
    load_backbone,
    model_config_dict,
    save_checkpoint,
)
from models.training.progress import NO_PROGRESS, Progress
from models.training.teacher import teacher_risks
from precursor.contracts.outcomes import OK

log = logging.getLogger(__name__)

DEFAULT_WINDOW_H = 30.0
"""The window length where none is given (``precursor train`` defaults it to the horizon)."""

DEFAULT_SEARCH: tuple[dict[str, Any], ...] = ({"block_stats": ["mean", "slope"]},)
"""What training tries beside the settings as given where the data is small (``TrainSettings.search`` None): block
slopes beside block means. The trees read each block's slope, the LM's tokens only its mean. Where the slope carries
the signal (the server-metrics profile) validation kept it on every seed of three draws and LM minus gradient boosting
went from -0.015 to +0.034 there; over the quality suite the LM's lead went from +0.018 to +0.025 (BENCHMARKS.md,
"Block slopes where validation wants them, by default")."""


class TrainSettings(BaseModel):
    """Everything ``precursor train`` can be told, with defaults that fit C-MAPSS-sized data on two CPU cores.

    The tokenizer's settings are its own object (``tokenizer``, with the horizon and window length the labels use as
    well); they may also be given by their names at the top level (``blocks=3``, as ``precursor train --set`` and
    retrain variables name them), where they win over the same names inside ``tokenizer``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: TokenizerSettings
    # Its defaults are the ones trained here. One level token per block and sensor, and the trend and spread over the
    # whole window: on C-MAPSS FD001 this beat mean, std and slope per block (test PR-AUC 0.93 against 0.85), with fewer
    # tokens to attend over. residual: each sensor as what the others do not explain (models.edge.features.
    # SensorScaling), for fleets whose sensors all follow a varying operating point. restart_at_failure: statistics
    # start again after a failure inside the window, so the repaired machine is measured apart from the one that failed
    # (models.edge.features.blank_before_failure); opt-in: on the simulator's fleet it narrowed the gap to gradient
    # boosting (0.014-0.022 against 0.025-0.037) more by what it took from the trees than by what the LM gained (0.529
    # and 0.521 against 0.516 and 0.528). windows
    every_h: Annotated[float, Field(gt=0)] = 1.0
    min_points: Annotated[int, Field(ge=1)] = 3
    # model
    # The defaults are ModelConfig's (see there for why), read from it so the two cannot drift apart.
    n_layer: Annotated[int, Field(ge=1)] = ModelConfig.n_layer
    n_embd: Annotated[int, Field(ge=8)] = ModelConfig.n_embd
    n_head: Annotated[int, Field(ge=1)] = ModelConfig.n_head
    dropout: Annotated[float, Field(ge=0, lt=1)] = ModelConfig.dropout
    attention_dropout: Annotated[float | None, Field(ge=0, lt=1)] = ModelConfig.attention_dropout
    backbone: Path | None = None
    # optimisation
    seed: int = 0
    batch_size: Annotated[int, Field(ge=1)] = 64
    learning_rate: Annotated[float, Field(gt=0)] = 2e-3
    weight_decay: Annotated[float, Field(ge=0)] = 0.01
    warmup_steps: Annotated[int, Field(ge=0)] = 50
    max_steps: Annotated[int, Field(ge=1)] = 600
    # A cap, not a target: FD001 (C-MAPSS size) reaches its 600 steps and the refit's well inside it. FD004, two and a
    # half times the engines, needs about 14 minutes with another training on the 2-core box; at 8 (the default
    # until 2026-12-03) its selection and refit were cut short and test PR-AUC was 0.810 against 0.856, and at 12 it
    # still stopped at about 500 of 600 selection steps in the quality suite (BENCHMARKS.md, "Refit by default", "The
    # fused GELU and a 16-minute budget").
    max_minutes: Annotated[float, Field(gt=0)] = 16.0
    eval_every: Annotated[int, Field(ge=1)] = 100
    # Validation PR-AUC a later step may give up and still be chosen over the best one (fit_model): on small validation
    # sets steps hundreds apart score within noise of each other, and the later one has trained longer at a lower rate.
    # 0.02 by default since 2026-12-04: over the whole quality suite, three seeds each, LM minus gradient boosting went
    # from +0.006 to +0.010; FD004 from 0.829 to 0.845 (ahead of the trees' 0.839; validation had kept step 400 of 600
    # on two seeds), the error-code fleet from 0.393 to 0.410, the server fleet from 0.394 to 0.400, and four datasets
    # lost 0.001-0.002 (BENCHMARKS.md, "A later step when validation cannot tell").
    step_tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.02
    aux_loss_weight: Annotated[float, Field(ge=0)] = 0.5
    followup_loss_weight: Annotated[float, Field(ge=0)] = 0.5
    # Which kind of failure, against whether one comes (sequence_loss): 1 is plain cross-entropy on the outcome token.
    # On the simulator's fleet 0.25 raised validation PR-AUC (0.580-0.591 against 0.560-0.569) but not test PR-AUC
    # (0.519-0.528 against 0.521-0.529), so the default stays 1. At 0, with restart_at_failure, one seed of four beat
    # gradient boosting there (0.557, 0.530, 0.515, 0.531 against 0.543), and per-kind risks are then untrained.
    kind_loss_weight: Annotated[float, Field(ge=0)] = 1.0
    token_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    # Gradient boosting's out-of-fold risk of each training window as a soft target beside the hard label, with this
    # weight (models.training.teacher): the trees turn a fleet's few failures into a graded risk per window. 1.0 by
    # default since 2026-12-06. Over the whole quality suite (three seeds, 2026-12-04) it raised the slow (+0.025) and
    # daily (+0.016) fleets and lowered the error-code fleet (-0.013) and FD004 (-0.008), +0.004 on the mean of eight;
    # on two more draws of each of those three simulated profiles (--fleet-seed 2 and 3, three seeds each) it raised
    # all six, +0.009 to +0.072: better on 8 of 9 fleet draws, +0.028 on average (BENCHMARKS.md, "Other draws of the
    # simulated fleets"). Training only: the edge runs the LM alone. 0 turns it off.
    teacher_weight: Annotated[float, Field(ge=0)] = 1.0
    # Bin tokens start on a line through embedding space, in order (models.training.model.init_ordinal_embeddings). Off
    # by default: on the simulator's fleet it reached its best validation step sooner but lower (0.566 against 0.591).
    ordinal_init: bool = False
    # Statistic tokens also carry their value (models.training.model.ValueGPT2LMHeadModel): binning loses where in its
    # bin a reading lies, and gradient boosting fitted on the LM's own statistics lost 0.04-0.12 PR-AUC when it saw them
    # binned (bench/lm_information.py, bench/tree_ablation.py). Our own GPT-2 only: off by default with a backbone. On
    # by default since 2026-12-03: over the whole quality suite, three seeds each, it raised the LM's mean test PR-AUC
    # on five datasets of eight and by 0.005 on average (the daily fleet most, 0.484 against 0.454), and lowered it on
    # FD004 and the error-code fleet (BENCHMARKS.md, "The value channel across the suite").
    value_channel: bool = True
    ema_decay: Annotated[float, Field(ge=0, lt=1)] = 0.99
    # Models trained from seeds seed, seed + 1, ... and averaged into one (models.training.model.EnsembleLM, one ONNX
    # graph at the edge); max_minutes is shared among them. On the simulator's fleet four members scored 0.550 test
    # PR-AUC where the same four alone averaged 0.537 (gradient boosting: 0.543); ahead of the trees on three simulated
    # fleets of four. Each member costs its training time again and its share of edge latency. Default 1: the edge's
    # throughput target is for one model.
    members: Annotated[int, Field(ge=1, le=16)] = 1
    threads: Annotated[int, Field(ge=1, le=256)] = 1
    # Where training runs: the edge never trains, but a cloud retraining worker may have a GPU. The exported model is
    # the same either way (weights come back to the CPU before export).
    device: Annotated[str, Field(pattern=r"^(cpu|auto|cuda(:\d+)?)$")] = "cpu"
    # Train the final model again on training + validation windows once validation has chosen the step, threshold and
    # calibration (train_on_windows, issue #17 item 3): the validation period holds the last failures, 37 % of the
    # windows on a 20-machine fleet, and without a refit the saved model never learns them. The refit starts afresh
    # from the same seed for the chosen step scaled by how many more windows it sees, and keeps the weights at the end.
    # It shares max_minutes with the selection run. On by default since 2026-12-03: over the quality suite's eight
    # datasets and three seeds it raised the LM's mean test PR-AUC on seven (+0.021 on average; FD004 +0.040, the
    # server fleet +0.050) and lowered it on C-MAPSS FD001 only (0.929 against 0.933); LM minus gradient boosting went
    # from -0.013 to +0.007. Training takes about twice as long (BENCHMARKS.md, "Refit by default").
    refit: bool = True
    # A small search inside training (issue #17 item 2): each entry overrides some of these settings (tokenizer names
    # included, e.g. {"block_stats": ["mean", "slope"]}). The settings as given and each variant are trained on the same
    # windows from the same seed, each within an equal share of max_minutes (selection_minutes), and the best on
    # validation PR-AUC is kept and alone refitted (train_on_windows). A list given is searched whatever it costs; []
    # searches nothing. None (the default) is DEFAULT_SEARCH where the data is small enough to pay for it: where the
    # settings as given make sequences of at most search_max_length fixed tokens (TelemetryTokenizer.fixed_length).
    # A step's cost grows with the sequence and the steps are fixed, so the sequence is what decides whether a second
    # selection run fits: the suite's simulated fleets (56-58 tokens) and real drives (81) search, C-MAPSS (111-153
    # tokens, 6-15 minutes on 2 cores without a search) does not.
    search: tuple[dict[str, Any], ...] | None = None
    search_max_length: Annotated[int, Field(ge=0)] = 96
    # split
    validation_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2
    min_validation_failures: Annotated[int, Field(ge=1)] = 3
    # The int8 export must make the fp32 model's alert decision on at least this share of validation windows.
    min_int8_agreement: Annotated[float, Field(ge=0, le=1)] = 0.99

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_names_at_the_top(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        flat = {name: data[name] for name in TokenizerSettings.model_fields if name in data}
        nested = data.get("tokenizer", {})
        if isinstance(nested, TokenizerSettings):
            nested = nested.model_dump()
        if not isinstance(nested, dict):
            return data  # not a mapping: the field's own validation says what is wrong
        rest = {k: v for k, v in data.items() if k not in flat}
        if rest.get("backbone") is not None:
            rest.setdefault("value_channel", False)  # a backbone reads token ids only
        # Regimes on by default for training: on C-MAPSS FD004 (6 min, seed 0) test PR-AUC 0.786 against 0.261
        # without (gradient boosting on the same scaling 0.839 against 0.680); no other fleet of the quality suite
        # has regimes, so nothing else changes.
        return {**rest, "tokenizer": {"window_h": DEFAULT_WINDOW_H, "regimes": True, **nested, **flat}}

    @property
    def horizon_h(self) -> float:
        """The question the model answers: a failure within this many hours after a window's end."""
        return self.tokenizer.horizon_h

    @model_validator(mode="after")
    def _value_channel_needs_our_model(self) -> TrainSettings:
        if self.value_channel and self.backbone is not None:
            raise ValueError("value_channel works with the built-in model only, not with a backbone")
        return self

    @model_validator(mode="after")
    def _search_names_settings(self) -> TrainSettings:
        known = set(type(self).model_fields) | set(TokenizerSettings.model_fields)
        for number, overrides in enumerate(self.search or (), start=1):
            forbidden = {"search", "search_max_length", "max_minutes", "tokenizer"}
            unknown = sorted(set(overrides) - known) + sorted(forbidden & set(overrides))
            if not overrides or unknown:
                raise ValueError(
                    f"search candidate {number} ({overrides!r}): "
                    + (f"cannot override {', '.join(unknown)}" if unknown else "overrides nothing")
                )
        return self

    def window_spec(self) -> WindowSpec:
        # The windows carry the events the tokenizer reads: its lookback before the window, and the window itself.
        return WindowSpec(
            window_h=self.tokenizer.window_h,
            horizon_h=self.tokenizer.horizon_h,
            every_h=self.every_h,
            min_points=self.min_points,
            event_lookback_h=self.tokenizer.window_h + self.tokenizer.event_lookback_h,
        )


@dataclass
class EncodedWindows:
    """Token ids, the outcome token to predict after each, and where the auxiliary loss starts in each sequence."""

    ids: list[list[int]]
    targets: np.ndarray  # (N,) outcome token id
    failed: np.ndarray  # (N,) bool
    body_start: np.ndarray  # (N,) index of the first token after the context
    followups: np.ndarray  # (N,) the token after the outcome: time to the next failure (<next:B>)
    values: list[np.ndarray] | None = None  # beside each id, its value, for a model with a value channel
    teacher: np.ndarray | None = None  # (N,) the trees' out-of-fold risk of each window (models.training.teacher)

    def subset(self, rows: np.ndarray) -> EncodedWindows:
        return EncodedWindows(
            ids=[self.ids[i] for i in rows],
            targets=self.targets[rows],
            failed=self.failed[rows],
            body_start=self.body_start[rows],
            followups=self.followups[rows],
            values=None if self.values is None else [self.values[i] for i in rows],
            teacher=None if self.teacher is None else self.teacher[rows],
        )

    def concat(self, other: EncodedWindows) -> EncodedWindows:
        """These windows, then ``other``'s: a refit learns training and validation windows as one set."""
        if (self.values is None) != (other.values is None):
            raise ValueError("cannot join windows encoded with values to windows encoded without")
        return EncodedWindows(
            ids=[*self.ids, *other.ids],
            targets=np.concatenate([self.targets, other.targets]),
            failed=np.concatenate([self.failed, other.failed]),
            body_start=np.concatenate([self.body_start, other.body_start]),
            followups=np.concatenate([self.followups, other.followups]),
            values=None if self.values is None or other.values is None else [*self.values, *other.values],
            teacher=None
            if self.teacher is None or other.teacher is None
            else np.concatenate([self.teacher, other.teacher]),
        )

    @classmethod
    def of(
        cls, tokenizer: TelemetryTokenizer, windows: Sequence[LabeledWindow], *, values: bool = False
    ) -> EncodedWindows:
        plain = [w.window for w in windows]
        encoded = tokenizer.encode_with_values(plain) if values else None
        ids = encoded.ids if encoded is not None else tokenizer.encode_many(plain)
        body_ids = tokenizer.body_start_ids
        return cls(
            ids=ids,
            targets=np.array([tokenizer.outcome_id(w.outcome) for w in windows], dtype=np.int64),
            failed=np.array([w.failed for w in windows], dtype=bool),
            body_start=np.array([next((i for i, t in enumerate(s) if t in body_ids), 0) for s in ids], dtype=np.int64),
            followups=np.array([tokenizer.time_to_failure_id(w.hours_to_failure) for w in windows], dtype=np.int64),
            values=encoded.values if encoded is not None else None,
        )


def hide_readings(
    batch: EncodedWindows, missing_ids: np.ndarray, rate: float, rng: np.random.Generator
) -> EncodedWindows:
    """A copy of the batch with each sensor token replaced by its "missing" token with probability ``rate`` (and its
    value, if any, by 0, as the tokenizer gives a missing reading)."""
    if rate <= 0:
        return batch
    hidden, hidden_values = [], []
    for i, ids in enumerate(batch.ids):
        seq = np.asarray(ids)
        swap = missing_ids[seq]  # (L,) -1 where the token is not a sensor reading
        hit = (swap >= 0) & (rng.random(len(seq)) < rate)
        hidden.append(np.where(hit, swap, seq).tolist())
        if batch.values is not None:
            hidden_values.append(np.where(hit, np.float32(0.0), batch.values[i]))
    values = hidden_values if batch.values is not None else None
    return replace(batch, ids=hidden, values=values)


def auxiliary_targets(batch: EncodedWindows, last_index: np.ndarray, width: int) -> np.ndarray:
    """``(B, width - 1)`` bool: position j predicts token j + 1, counted when that token is in the window's body.

    The body starts after the context (``body_start``) and ends at the horizon token; left truncation shifts it.
    """
    positions = np.arange(width - 1)[None, :] + 1  # the target index of each position
    lengths = np.array([len(s) for s in batch.ids])
    start = np.maximum(batch.body_start - (lengths - last_index - 1), 0)[:, None]
    return (positions > start) & (positions <= last_index[:, None])


@dataclass(frozen=True)
class Losses:
    total: torch.Tensor
    outcome: float
    followup: float
    body: float


def sequence_loss(
    model: PreTrainedModel,
    batch: EncodedWindows,
    pad_id: int,
    context: int,
    *,
    aux_loss_weight: float,
    followup_loss_weight: float = 0.0,
    kind_loss_weight: float = 1.0,
    failure_ids: Sequence[int] = (),
    teacher_weight: float = 0.0,
) -> Losses:
    """The training loss of one batch; the forward contract is ids + mask -> logits.

    The horizon position predicts the outcome, as two terms: whether a failure comes (``-log p(ok)``, or ``-log`` of
    the mass on ``failure_ids``, every failure token), and which kind it is (``-log p(kind | failure)``, failed
    windows only), weighted by ``kind_loss_weight``. At weight 1 the two add up to the plain cross-entropy on the
    outcome token. Each body position predicts the next body token (weighted by ``aux_loss_weight``). With
    ``followup_loss_weight``, the outcome token is fed after the sequence and its position predicts the
    time-to-failure bucket, when the model's ``context`` has room for it. With ``teacher_weight`` and the batch's
    ``teacher`` risks, whether a failure comes is also learned against those (binary cross-entropy).
    """
    feed_answer = followup_loss_weight > 0 and max(len(s) for s in batch.ids) < context
    answered = [[*ids, int(t)] for ids, t in zip(batch.ids, batch.targets, strict=True)]
    sequences = answered if feed_answer else batch.ids
    values = batch.values
    if values is not None and feed_answer:
        values = [np.append(v, np.float32(0.0)) for v in values]
    packed = pack_sequences(sequences, pad_id=pad_id, max_length=context, values=values)
    device = model.device

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device, non_blocking=True)

    input_ids = tensor(packed.input_ids)
    values_in = None if packed.values is None else tensor(packed.values)
    # Logits only where a loss reads them (models.training.model.hidden_and_head): the same losses, no (B, L, V) tensor.
    hidden, head = hidden_and_head(model, input_ids, tensor(packed.attention_mask), values_in)  # (B, L, C)
    question = packed.last_index - 1 if feed_answer else packed.last_index  # where each horizon token sits
    rows = torch.arange(len(question), device=device)
    at_question = head(hidden[rows, tensor(question)])  # (B, V)
    outcome_loss = outcome_nll(at_question, tensor(batch.targets), tensor(batch.failed), failure_ids, kind_loss_weight)
    total = outcome_loss
    if teacher_weight > 0 and batch.teacher is not None and failure_ids:
        total = total + teacher_weight * teacher_bce(at_question, tensor(batch.teacher), failure_ids)
    followup_loss = torch.zeros((), device=device)
    if feed_answer:
        answer = tensor(packed.last_index)
        followup_loss = F.cross_entropy(head(hidden[rows, answer]), tensor(batch.followups))
        total = total + followup_loss_weight * followup_loss
    body_loss = torch.zeros((), device=device)
    if aux_loss_weight > 0:
        wanted = tensor(auxiliary_targets(batch, question, input_ids.shape[1]))  # (B, L-1)
        body_loss = F.cross_entropy(head(hidden[:, :-1][wanted]), input_ids[:, 1:][wanted])
        total = total + aux_loss_weight * body_loss
    return Losses(total, outcome_loss.item(), followup_loss.item(), body_loss.item())


def outcome_nll(
    logits: torch.Tensor, targets: torch.Tensor, failed: torch.Tensor, failure_ids: Sequence[int], kind_weight: float
) -> torch.Tensor:
    """Mean over the batch of ``-log p(failure or not) - kind_weight * log p(kind | failure)``.

    Why split: the alert reads only whether a failure comes (``1 - p(ok)``). Trained on the kind token alone, every
    failed window whose kind the model mistakes counts against it even where it was sure a failure comes, and the
    few failures of a fleet are split five ways. ``logits`` ``(B, V)`` at the horizon token; ``targets`` the outcome
    token ids; ``failed`` which windows failed.
    """
    if not failure_ids or kind_weight == 1.0:
        return F.cross_entropy(logits, targets)  # what the two terms add up to, without the round trip
    log_p = F.log_softmax(logits.float(), dim=-1)
    target = log_p.gather(1, targets[:, None])[:, 0]
    failure = torch.logsumexp(log_p[:, list(failure_ids)], dim=-1)
    whether = torch.where(failed, failure, target)
    which = torch.where(failed, target - failure, torch.zeros_like(target))
    return -(whether + kind_weight * which).mean()


def teacher_bce(logits: torch.Tensor, teacher: torch.Tensor, failure_ids: Sequence[int]) -> torch.Tensor:
    """Mean binary cross-entropy of the model's "a failure comes" (its mass on ``failure_ids``, against the rest)
    against the teacher's risks ``(B,)``."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    failure = torch.logsumexp(log_p[:, list(failure_ids)], dim=-1)
    other = torch.log1p(-failure.exp().clamp(max=1 - 1e-6))
    target = teacher.float().clamp(0.0, 1.0)
    return -(target * failure + (1 - target) * other).mean()


def validation_scores(model: PreTrainedModel, tokenizer: TelemetryTokenizer, encoded: EncodedWindows) -> np.ndarray:
    """``risk["failure"]`` of each validation window, read exactly as the edge reads it."""
    logits = last_logits(model, encoded.ids, tokenizer.pad_id, values=encoded.values)
    probs = outcome_probabilities(logits, tokenizer.outcome_tokens)
    return 1.0 - probs["ok"]


@dataclass
class FitResult:
    model: PreTrainedModel
    step: int
    validation: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0


@dataclass
class _Checkpoint:
    step: int
    pr_auc: float
    outcome_nll: float
    state: dict[str, torch.Tensor]


def _best(checkpoints: Sequence[_Checkpoint]) -> _Checkpoint:
    """The highest validation PR-AUC; the lower outcome log loss between equals; the earlier step between those."""
    return max(checkpoints, key=lambda c: (c.pr_auc, -c.outcome_nll, -c.step))


def _within_tolerance(checkpoints: list[_Checkpoint], tolerance: float) -> list[_Checkpoint]:
    """The checkpoints that may still be chosen: the best, and with a tolerance every one that close to it."""
    best = _best(checkpoints)
    if tolerance == 0:
        return [best]
    return [c for c in checkpoints if c.pr_auc >= best.pr_auc - tolerance]


def _chosen_checkpoint(checkpoints: Sequence[_Checkpoint], tolerance: float) -> _Checkpoint:
    """The best on validation, or with a tolerance the latest step within it of the best (checkpoints in step order)."""
    return _within_tolerance(list(checkpoints), tolerance)[-1]


def fit_model(
    model: PreTrainedModel,
    tokenizer: TelemetryTokenizer,
    train: EncodedWindows,
    validation: EncodedWindows | None,
    settings: TrainSettings,
    progress: Progress = NO_PROGRESS,
) -> FitResult:
    """Train, scoring validation every ``eval_every`` steps; return the model as it was at its best validation step
    (with ``step_tolerance``, the latest step within that much validation PR-AUC of the best).

    Without ``validation`` (a refit on every window, whose step was chosen before) nothing is chosen: the model is
    the one at the end (its moving average), and the history holds the training losses only.
    ``progress`` is told each step (the current stage's total is ``max_steps``; the time budget may end it early).
    """
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    model.to(training_device(settings.device))
    context = context_length(model)
    failure_ids = [i for kind, i in tokenizer.outcome_tokens.items() if kind != OK]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.learning_rate,
        betas=(0.9, 0.95),
    )

    def learning_rate(step: int) -> float:
        if step < settings.warmup_steps:
            return settings.learning_rate * (step + 1) / settings.warmup_steps
        progress = min(1.0, (step - settings.warmup_steps) / max(1, settings.max_steps - settings.warmup_steps))
        return settings.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    # An exponential moving average of the weights: smoother than the last step's, which overfit small fleets.
    averaged = AveragedModel(model, avg_fn=_ema(settings.ema_decay)) if settings.ema_decay > 0 else None
    missing_ids = tokenizer.missing_ids()
    started = time.monotonic()
    deadline = started + settings.max_minutes * 60
    # Every validated step that may still be chosen: one within step_tolerance of the best so far (the best only rises).
    kept: list[_Checkpoint] = []
    best_state: dict[str, torch.Tensor] | None = None
    best_step, best_metrics = 0, {}
    history: list[dict[str, float]] = []
    order = rng.permutation(len(train.ids))
    cursor = 0
    model.train()
    step = 0
    running = np.zeros(4)  # outcome, follow-up and body losses, steps
    while step < settings.max_steps:
        if cursor + settings.batch_size > len(order):
            order, cursor = rng.permutation(len(train.ids)), 0
        rows = order[cursor : cursor + settings.batch_size]
        cursor += settings.batch_size
        batch = hide_readings(train.subset(rows), missing_ids, settings.token_dropout, rng)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        losses = sequence_loss(
            model,
            batch,
            tokenizer.pad_id,
            context,
            aux_loss_weight=settings.aux_loss_weight,
            followup_loss_weight=settings.followup_loss_weight,
            kind_loss_weight=settings.kind_loss_weight,
            failure_ids=failure_ids,
            teacher_weight=settings.teacher_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        losses.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if averaged is not None:
            averaged.update_parameters(model)
        step += 1
        progress.advance()
        running += (losses.outcome, losses.followup, losses.body, 1)
        out_of_time = time.monotonic() >= deadline
        if step % settings.eval_every == 0 or step == settings.max_steps or out_of_time:
            scored = averaged.module if averaged is not None else model
            on_validation: dict[str, float] = {}
            if validation is not None:
                scores = validation_scores(scored, tokenizer, validation)
                pr_auc = average_precision(validation.failed, scores) or 0.0
                validation_nll = log_loss(validation.failed, scores)
                on_validation = {"validation_pr_auc": pr_auc, "validation_outcome_nll": validation_nll}
            record = {
                "step": step,
                "seconds": round(time.monotonic() - started, 1),
                "train_outcome_loss": float(running[0] / running[3]),
                "train_followup_loss": float(running[1] / running[3]),
                "train_body_loss": float(running[2] / running[3]),
                **on_validation,
            }
            history.append(record)
            log.info("step %d: %s", step, record)
            running[:] = 0
            if validation is not None:
                kept.append(_Checkpoint(step, pr_auc, validation_nll, copy.deepcopy(scored.state_dict())))
                kept = _within_tolerance(kept, settings.step_tolerance)
            model.train()
        if out_of_time:
            break
    if kept:
        chosen = _chosen_checkpoint(kept, settings.step_tolerance)
        best_state, best_step = chosen.state, chosen.step
        best_metrics = {"pr_auc": chosen.pr_auc, "outcome_nll": chosen.outcome_nll}
    if validation is None:
        best_state = copy.deepcopy((averaged.module if averaged is not None else model).state_dict())
        best_step = step
    if best_state is not None:
        model.load_state_dict(best_state)
    model.to("cpu")  # export, saving and the scorers downstream work on the CPU
    model.eval()
    return FitResult(model, best_step, best_metrics, history, time.monotonic() - started, settings.seed)


def available_threads(most: int = 2) -> int:
    """The torch threads for a training that has the machine to itself: the cores this process may run on, at most
    ``most`` (2: what the 2-core box measured; whether more pays on a larger one is not measured)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(most, cores))


def training_device(name: str) -> torch.device:
    """``cpu``, ``cuda[:N]``, or ``auto`` (the first GPU when torch sees one, else the CPU); a clear error for a GPU
    that is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}: torch sees no CUDA GPU here (use cpu or auto)")
    return device


def _ema(decay: float) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """EMA with a warm-up: early on the decay is (1 + n) / (10 + n), so a short run is not stuck at its start."""

    def update(averaged: torch.Tensor, current: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        d = min(decay, (1.0 + float(n)) / (10.0 + float(n)))
        return averaged * d + current * (1.0 - d)

    return update


@dataclass
class TrainResult:
    checkpoint_dir: Path
    artifact_dir: Path | None
    meta: CheckpointMeta
    seconds: float
    validation_risks: np.ndarray | None = None
    """Each validation window's calibrated risk from the model that chose the threshold (before any refit), in the
    validation windows' order: what ``meta.threshold`` was chosen on, so another alert rule can be tried on the same
    risks without training again (``bench/quality_suite.py --keep-scores``)."""


_ARCHITECTURE = {"n_layer", "n_embd", "n_head", "dropout", "attention_dropout", "value_channel"}
"""The settings that :class:`ModelConfig` takes as they are, under the same names."""


def model_config_for(tokenizer: TelemetryTokenizer, settings: TrainSettings) -> ModelConfig:
    """The default architecture for a fitted tokenizer: its vocabulary, and one position more than its sequences
    (training feeds the outcome token after the horizon token to ask for the time to failure)."""
    return ModelConfig(
        vocab_size=tokenizer.vocab_size,
        n_positions=settings.tokenizer.max_length + 1,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        **settings.model_dump(include=_ARCHITECTURE),
    )


def failures_in(windows: Sequence[LabeledWindow]) -> int:
    """How many distinct failures the failed windows warn of."""
    return len({(w.window.machine_id, round(w.end_s + (w.hours_to_failure or 0) * 3600)) for w in windows if w.failed})


def member_record(fit: FitResult) -> dict[str, Any]:
    """What ``precursor.json`` keeps of each ensemble member's training."""
    return {"seed": fit.seed, "step": fit.step, "validation": fit.validation, "history": fit.history}


def fresh_model(
    tokenizer: TelemetryTokenizer, settings: TrainSettings, architecture: ModelConfig | None
) -> PreTrainedModel:
    """The untrained model for a fitted tokenizer: built from ``architecture``, or the backbone when it is None;
    its random start drawn from ``settings.seed``."""
    torch.manual_seed(settings.seed)
    if architecture is None:
        assert settings.backbone is not None
        model = load_backbone(settings.backbone, tokenizer.vocab_size)
    else:
        model = build_model(architecture)
        if count_parameters(model) > MAX_DEFAULT_PARAMETERS:
            log.warning(
                "%d parameters: above the %d a default model keeps to", count_parameters(model), MAX_DEFAULT_PARAMETERS
            )
    if settings.ordinal_init:
        init_ordinal_embeddings(
            model, tokenizer.ordinal_families(), generator=torch.Generator().manual_seed(settings.seed)
        )
    if context_length(model) <= tokenizer.fixed_length:
        raise DatasetError(
            f"the model's context ({context_length(model)} tokens) is shorter than the tokenizer's sequences "
            f"({tokenizer.fixed_length} tokens and more)"
        )
    return model


def refit_on_everything(
    fits: Sequence[FitResult],
    tokenizer: TelemetryTokenizer,
    train: EncodedWindows,
    validation: EncodedWindows,
    settings: TrainSettings,
    architecture: ModelConfig | None,
    budget_s: float,
    progress: Progress = NO_PROGRESS,
    teacher_of: Callable[[int], np.ndarray] | None = None,
) -> list[FitResult]:
    """Each selected model trained again from its own seed on training + validation windows, with nothing chosen.

    ``teacher_of(seed)``, when given, is the teacher's risk of every window (training then validation) for a member
    whose seed is not ``settings.seed``; that one's are the windows' own.

    Its chosen step scaled by how many more windows the refit sees keeps the epochs about the same (the step was
    chosen for that much learning, not for that many updates); its own warm-up and cosine schedule run over those
    steps. ``budget_s`` is what the selection left of the time budget, shared by the members; a refit that would not
    fit in its share is cut to the steps that do (from the selection run's time a step), and says so.
    """
    everything = train.concat(validation)
    scale = len(everything.ids) / len(train.ids)
    refits: list[FitResult] = []
    for member, fit in enumerate(fits):
        left_s = max(budget_s - sum(done.seconds for done in refits), 0.0) / (len(fits) - member)
        steps_run = int(fit.history[-1]["step"]) if fit.history else max(fit.step, 1)
        step_s = fit.seconds / max(steps_run, 1)  # with its validation scoring: a refit step costs less
        wanted = max(1, round(fit.step * scale))
        steps = max(1, min(wanted, int(left_s / step_s) if step_s > 0 else wanted))
        if steps < wanted:
            log.warning("refit of seed %d: %d steps fit in the %.0f s left, not %d", fit.seed, steps, left_s, wanted)
        member_settings = settings.model_copy(
            update={"seed": fit.seed, "max_steps": steps, "max_minutes": max(left_s, 1.0) / 60}
        )
        member_name = f" member {member + 1} of {len(fits)}" if len(fits) > 1 else ""
        progress.stage(f"refitting{member_name} on training + validation (steps)", total=steps)
        model = fresh_model(tokenizer, member_settings, architecture)
        learned = everything
        if teacher_of is not None and fit.seed != settings.seed:
            learned = replace(everything, teacher=teacher_of(fit.seed))
        refits.append(fit_model(model, tokenizer, learned, None, member_settings, progress))
        log.info("refit of seed %d: %d steps on %d windows", fit.seed, refits[-1].step, len(everything.ids))
    return refits


class _Fitted(NamedTuple):
    """The kept candidate trained (and refitted), nothing written yet: what ``train_on_windows`` saves."""

    model: torch.nn.Module
    tokenizer: TelemetryTokenizer
    meta: CheckpointMeta
    validation_encoded: EncodedWindows
    validation_risks: np.ndarray


@dataclass
class _Selected:
    """One candidate through steps 2 to 5 before any refit: what the search compares."""

    settings: TrainSettings
    tokenizer: TelemetryTokenizer
    architecture: ModelConfig | None
    train_encoded: EncodedWindows
    validation_encoded: EncodedWindows
    fits: list[FitResult]
    result: FitResult
    scores: np.ndarray
    raw_threshold: float
    calibration: Calibration
    validation: dict[str, Any]

    @property
    def pr_auc(self) -> float:
        return float(self.validation["pr_auc"])


def fitted_tokenizer(settings: TrainSettings, train_windows: Sequence[LabeledWindow]) -> TelemetryTokenizer:
    """The tokenizer of ``settings``, fitted on the training windows (their statistics and outcomes) only."""
    tokenizer = TelemetryTokenizer(settings.tokenizer)
    tokenizer.fit([w.window for w in train_windows], outcomes=[w.outcome for w in train_windows])
    return tokenizer


EVENT_ROOM = 32
"""Tokens a sequence keeps for events and errors when training cuts a window into fewer blocks to fit ``max_length``
(the error-code fleets' sequences carry up to about this many)."""


def tokenizer_that_fits(
    settings: TrainSettings, train_windows: Sequence[LabeledWindow]
) -> tuple[TrainSettings, TelemetryTokenizer, dict[str, Any] | None]:
    """(settings, their tokenizer fitted on the training windows, what was changed or None).

    Where the data's sensors make the fixed part of a sequence longer than ``max_length`` (four blocks of 47 sensors
    are 298 tokens), and the settings did not name ``blocks``, the window is cut into the most blocks that leave
    :data:`EVENT_ROOM` tokens for events; at one block, one window statistic (the slope) if ``window_stats`` was not
    named either. The block count is a default, not a fact of the data: a fleet with dozens of metrics should train, not
    stop at "use fewer blocks". Named settings are kept, and a sequence that does not fit them fails as before.
    """
    try:
        return settings, fitted_tokenizer(settings, train_windows), None
    except SequenceTooLongError as err:
        given = settings.tokenizer.model_fields_set
        if "blocks" in given:
            raise
        tried: list[dict[str, Any]] = [{"blocks": b} for b in range(settings.tokenizer.blocks - 1, 0, -1)]
        if "window_stats" not in given and len(settings.tokenizer.window_stats) > 1:
            tried.append({"blocks": 1, "window_stats": settings.tokenizer.window_stats[:1]})
        room = settings.tokenizer.max_length - min(EVENT_ROOM, settings.tokenizer.max_length // 4)
        for overrides in tried:
            shorter = settings.tokenizer.model_copy(update=overrides)
            fixed = fixed_length_of(err.sensors, err.context, shorter)
            if fixed <= room:
                changed = settings.model_copy(update={"tokenizer": shorter})
                log.info(
                    "%d sensors: %s, so a sequence's fixed part is %d tokens of max_length %d (%s)",
                    err.sensors,
                    ", ".join(f"{k} {list(v) if isinstance(v, tuple) else v}" for k, v in overrides.items()),
                    fixed,
                    shorter.max_length,
                    err,
                )
                record = {"sensors": err.sensors, "fixed_length": fixed, **overrides}
                return changed, fitted_tokenizer(changed, train_windows), record
        raise


@dataclass(frozen=True)
class Candidate:
    """Settings a search trains: the ones given, with ``overrides`` (setting names and values) applied."""

    settings: TrainSettings
    overrides: dict[str, Any]


def search_variants(settings: TrainSettings, tokenizer: TelemetryTokenizer | None = None) -> tuple[dict[str, Any], ...]:
    """The overrides a training tries beside the settings as given: ``settings.search`` where it is a list. Else (the
    default search) each of :data:`DEFAULT_SEARCH` whose sequences fit its ``max_length``, where the settings as given
    make at most ``search_max_length`` fixed tokens a window; ``tokenizer`` is theirs, fitted on the training
    windows."""
    if settings.search is not None:
        return settings.search
    if tokenizer is None:
        raise ValueError("the default search needs the tokenizer of the settings as given, fitted")
    if tokenizer.fixed_length > settings.search_max_length:
        return ()

    def fits(overrides: dict[str, Any]) -> bool:
        variant = candidate_settings(settings, overrides).tokenizer
        return tokenizer.fixed_length_under(variant) <= variant.max_length

    return tuple(overrides for overrides in DEFAULT_SEARCH if fits(overrides))


def candidate_settings(settings: TrainSettings, overrides: dict[str, Any]) -> TrainSettings:
    """``settings`` with ``overrides`` (setting names, tokenizer ones included) applied, and no search of their own."""
    given = settings.model_dump(exclude={"search", "tokenizer"})
    return TrainSettings.model_validate(
        {**given, "tokenizer": settings.tokenizer.model_dump(), **overrides, "search": ()}
    )


def search_candidates(settings: TrainSettings, variants: Sequence[dict[str, Any]] | None = None) -> list[Candidate]:
    """The settings as given, then each variant (``settings.search`` unless given) applied to them (the time budget
    is shared out by :func:`selection_minutes`)."""
    chosen = (settings.search or ()) if variants is None else variants
    return [Candidate(candidate_settings(settings, overrides), dict(overrides)) for overrides in ({}, *chosen)]


def selection_minutes(settings: TrainSettings, train_windows: int, validation_windows: int, candidates: int) -> float:
    """Each candidate's share of ``max_minutes`` for its selection run (all members together).

    With a refit to come, the budget is shared by the candidates' selection runs and the one refit, in proportion to
    the windows each learns (the refit learns training and validation windows): for a plain run, the selection gets
    ``T / (2T + V)`` of it. A refit that does not fit in what the selections leave is cut (:func:`refit_on_everything`).
    """
    if not settings.refit:
        return settings.max_minutes / candidates
    return settings.max_minutes * train_windows / (candidates * train_windows + train_windows + validation_windows)


def _select(
    train_windows: Sequence[LabeledWindow],
    validation_windows: Sequence[LabeledWindow],
    settings: TrainSettings,
    minutes: float,
    progress: Progress,
    tokenizer: TelemetryTokenizer | None = None,
) -> _Selected:
    """Steps 2 to 5 of the recipe for one set of settings, within ``minutes``: the model validation chooses, its
    threshold and calibration; no refit yet. ``tokenizer``: already fitted to these settings and training windows
    (fitting draws on no global random state, so it may happen before the seeds are set)."""
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)  # whatever ran before in this process; each model's weights: fresh_model
    progress.stage("tokenizing windows")
    if tokenizer is None:
        tokenizer = fitted_tokenizer(settings, train_windows)
    train_encoded = EncodedWindows.of(tokenizer, train_windows, values=settings.value_channel)
    validation_encoded = EncodedWindows.of(tokenizer, validation_windows, values=settings.value_channel)
    if settings.teacher_weight > 0:
        progress.stage("fitting the teacher (gradient boosting, out of fold)")
        train_encoded.teacher = teacher_risks(
            train_windows, tokenizer.settings.model_dump(mode="json"), seed=settings.seed
        )

    architecture = model_config_for(tokenizer, settings) if settings.backbone is None else None
    fits = []
    for member in range(settings.members):
        # Each member from its own seed, with an equal share of the time; one member is exactly a plain run.
        member_settings = settings.model_copy(
            update={"seed": settings.seed + member, "max_minutes": minutes / settings.members}
        )
        member_name = f" member {member + 1} of {settings.members}" if settings.members > 1 else ""
        progress.stage(f"training{member_name} (steps)", total=settings.max_steps)
        model = fresh_model(tokenizer, member_settings, architecture)
        member_train = train_encoded
        if member and settings.teacher_weight > 0:
            # The teacher's folds and trees come from the seed too, so that one member is exactly a plain run.
            member_train = replace(
                train_encoded,
                teacher=teacher_risks(
                    train_windows, tokenizer.settings.model_dump(mode="json"), seed=member_settings.seed
                ),
            )
        fits.append(fit_model(model, tokenizer, member_train, validation_encoded, member_settings, progress))
        if settings.members > 1:
            log.info("member %d of %d: step %d, %s", member + 1, settings.members, fits[-1].step, fits[-1].validation)
    progress.stage("choosing the alert threshold, saving the checkpoint")
    if len(fits) == 1:
        result = fits[0]
        scores = validation_scores(result.model, tokenizer, validation_encoded)
    else:
        ensemble = EnsembleLM([fit.model for fit in fits]).eval()
        scores = validation_scores(ensemble, tokenizer, validation_encoded)  # type: ignore[arg-type]
        chosen = {
            "pr_auc": average_precision(validation_encoded.failed, scores) or 0.0,
            "outcome_nll": log_loss(validation_encoded.failed, scores),
        }
        # The step and history shown are the first member's; every member's are under training.member_fits.
        seconds = sum(fit.seconds for fit in fits)
        result = FitResult(ensemble, fits[0].step, chosen, fits[0].history, seconds, settings.seed)  # type: ignore[arg-type]
    raw_threshold = best_f1_threshold(validation_encoded.failed, scores)
    precision, recall, f1 = precision_recall_f1(validation_encoded.failed, scores, raw_threshold)
    calibration = fit_platt(validation_encoded.failed, scores)
    calibrated = calibration.probabilities(scores)
    validation = {
        **result.validation,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "raw_threshold": raw_threshold,
        "ece_raw": expected_calibration_error(validation_encoded.failed, scores),
        "ece_calibrated": expected_calibration_error(validation_encoded.failed, calibrated),
        "brier_raw": brier_score(validation_encoded.failed, scores),
        "brier_calibrated": brier_score(validation_encoded.failed, calibrated),
        # the bins of the reliability diagram, so whoever reads the signed artifact can draw it without the data
        "reliability_calibrated": [
            b.model_dump(mode="json") for b in reliability_bins(validation_encoded.failed, calibrated)
        ],
        "windows": len(validation_windows),
        "failed_windows": int(validation_encoded.failed.sum()),
        "failures": failures_in(validation_windows),
    }
    return _Selected(
        settings,
        tokenizer,
        architecture,
        train_encoded,
        validation_encoded,
        fits,
        result,
        scores,
        raw_threshold,
        calibration,
        validation,
    )


def _finish(
    selected: _Selected,
    train_windows: Sequence[LabeledWindow],
    validation_windows: Sequence[LabeledWindow],
    data: dict[str, Any] | None,
    budget_s: float,
    progress: Progress,
) -> _Fitted:
    """The kept candidate: refitted on every window (with ``refit``, within ``budget_s``), up to the checkpoint's
    metadata."""
    settings, tokenizer, architecture = selected.settings, selected.tokenizer, selected.architecture
    train_encoded, validation_encoded = selected.train_encoded, selected.validation_encoded
    fits, result, scores, raw_threshold = selected.fits, selected.result, selected.scores, selected.raw_threshold
    calibration, validation = selected.calibration, dict(selected.validation)
    # The map is strictly increasing, so the threshold on its scale alerts on exactly the windows the raw one did.
    threshold = calibration.probability(raw_threshold)
    refit: dict[str, Any] = {}
    if settings.refit:
        teacher_of: Callable[[int], np.ndarray] | None = None
        if settings.teacher_weight > 0:
            # Out of fold over every window the refit learns: the selection run's teacher never saw validation.
            progress.stage("fitting the teacher on training + validation windows")
            everything_windows = [*train_windows, *validation_windows]
            teacher_settings = tokenizer.settings.model_dump(mode="json")

            def teacher_of(seed: int) -> np.ndarray:
                return teacher_risks(everything_windows, teacher_settings, seed=seed)

            everything = teacher_of(settings.seed)
            train_encoded = replace(train_encoded, teacher=everything[: len(train_windows)])
            validation_encoded = replace(validation_encoded, teacher=everything[len(train_windows) :])
        refits = refit_on_everything(
            fits,
            tokenizer,
            train_encoded,
            validation_encoded,
            settings,
            architecture,
            budget_s,
            progress,
            teacher_of=teacher_of,
        )
        model = refits[0].model if len(refits) == 1 else EnsembleLM([fit.model for fit in refits]).eval()
        refit_scores = validation_scores(model, tokenizer, validation_encoded)  # type: ignore[arg-type]
        refit = {
            "windows": len(train_windows) + len(validation_windows),
            "failed_windows": int(train_encoded.failed.sum() + validation_encoded.failed.sum()),
            "failures": failures_in([*train_windows, *validation_windows]),
            "steps": [fit.step for fit in refits],
            "selected_steps": [fit.step for fit in fits],
            "seconds": round(sum(fit.seconds for fit in refits), 1),
            "histories": [fit.history for fit in refits],
        }
        # The threshold and calibration map stay the selected model's, chosen out of sample. Fitting the map again on
        # the refit model's own validation risks (in sample: it learned those windows) lowered test ECE on C-MAPSS,
        # Backblaze and the daily fleet but raised it on the three other simulated fleets, above 0.05 on two (0.064
        # against 0.032 on error codes, 0.051 against 0.019 on slow degradation; BENCHMARKS.md, "Refit on all the
        # data"). How far the risks moved: the refit model's alert rate at the same raw threshold against the
        # selected model's (in sample).
        validation["refit_in_sample"] = {
            "pr_auc": average_precision(validation_encoded.failed, refit_scores) or 0.0,
            "alert_rate": float(np.mean(refit_scores >= raw_threshold)),
            "selected_alert_rate": float(np.mean(scores >= raw_threshold)),
        }
        result = FitResult(model, result.step, result.validation, result.history, result.seconds, settings.seed)  # type: ignore[arg-type]
        result.seconds += refit["seconds"]
    spec = settings.window_spec()
    meta = CheckpointMeta(
        architecture=model_config_dict(architecture) if architecture is not None else None,
        backbone=str(settings.backbone) if settings.backbone is not None else None,
        parameters=count_parameters(result.model),
        members=settings.members,
        horizon_h=settings.horizon_h,
        threshold=threshold,
        window={
            "window_h": spec.window_h,
            "every_h": spec.every_h,
            "min_points": spec.min_points,
            "event_lookback_h": spec.event_lookback_h,
        },
        tokenizer_hash=tokenizer.content_hash,
        training={
            **settings.model_dump(mode="json", exclude={"backbone"}),
            "tokenizer": tokenizer.settings.model_dump(mode="json"),
            "seconds": round(result.seconds, 1),
            "history": result.history,
            **({"member_fits": [member_record(fit) for fit in fits]} if len(fits) > 1 else {}),
            **({"refit": refit} if refit else {}),
        },
        step=result.step,
        validation=validation,
        data={
            **(data or {}),
            "training_windows": outcome_counts(train_windows),
            "validation_windows": outcome_counts(validation_windows),
        },
        context_length=min(settings.tokenizer.max_length, context_length(result.model)),
        outcome_tokens=tokenizer.outcome_tokens,
        calibration=calibration.model_dump(mode="json"),
        metrics={"validation": validation},
    )
    return _Fitted(result.model, tokenizer, meta, validation_encoded, calibration.probabilities(scores))


def train_on_windows(
    train_windows: Sequence[LabeledWindow],
    validation_windows: Sequence[LabeledWindow],
    out: str | Path,
    settings: TrainSettings,
    *,
    data: dict[str, Any] | None = None,
    signing_key: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    version: str | None = None,
    progress: Progress = NO_PROGRESS,
) -> TrainResult:
    """Tokenizer -> model -> threshold -> checkpoint (-> signed artifact), from windows already split in time.

    Without ``signing_key``, ``out`` is the checkpoint folder. With it, ``out`` is the signed artifact and the
    checkpoint goes to ``checkpoint_dir`` (default: ``out`` with ``.checkpoint`` appended). ``data`` says where the
    windows came from (files, split); ``precursor evaluate`` refits the baselines from it.

    With ``settings.search``, every candidate (the settings as given, then each with its overrides) is trained on the
    same windows from the same seed, within an equal share of ``max_minutes`` (:func:`selection_minutes`); the one with
    the best validation PR-AUC is refitted (with ``refit``) and saved, and ``precursor.json`` lists what each scored
    under ``training.search_results``.
    """
    started = time.monotonic()
    cpu_started = time.process_time()  # all threads: torch trains on several
    out = Path(out)
    for name, windows in (("training", train_windows), ("validation", validation_windows)):
        counts = outcome_counts(windows)
        if not windows or set(counts) == {"ok"} or "ok" not in counts:
            raise DatasetError(f"the {name} period needs both ok and failed windows, has {counts or 'none'}")
    log.info("windows: training %s, validation %s", outcome_counts(train_windows), outcome_counts(validation_windows))

    gate: dict[str, Any] | None = None
    progress.stage("tokenizing windows")
    # Whether the default search runs depends on the sequence the data makes, and so may the number of blocks.
    settings, first_tokenizer, fitted_to_length = tokenizer_that_fits(settings, train_windows)
    variants = search_variants(settings, first_tokenizer)
    if settings.search is None:
        gate = {
            "fixed_length": first_tokenizer.fixed_length,
            "search_max_length": settings.search_max_length,
            "searched": bool(variants),
        }
        log.info(
            "default search %s: the settings as given make %d fixed tokens a window (search_max_length %d)",
            "on" if variants else "off",
            first_tokenizer.fixed_length,
            settings.search_max_length,
        )
    candidates = search_candidates(settings, variants)
    minutes = selection_minutes(settings, len(train_windows), len(validation_windows), len(candidates))
    selected: list[_Selected] = []
    for number, candidate in enumerate(candidates, start=1):
        if len(candidates) > 1:
            log.info("search: candidate %d of %d: %s", number, len(candidates), candidate.overrides or "as given")
        fitted = first_tokenizer if number == 1 else None
        selected.append(_select(train_windows, validation_windows, candidate.settings, minutes, progress, fitted))
    kept = max(range(len(selected)), key=lambda i: (selected[i].pr_auc, -i))  # a tie keeps the first
    budget_s = settings.max_minutes * 60 - sum(fit.seconds for one in selected for fit in one.fits)
    model, tokenizer, meta, validation_encoded, validation_risks = _finish(
        selected[kept], train_windows, validation_windows, data, budget_s, progress
    )
    meta.training["cpu_s"] = round(time.process_time() - cpu_started, 1)  # every candidate's: the flow view's cost
    if gate is not None:
        meta.training["default_search"] = gate
    if fitted_to_length is not None:
        meta.training["fitted_to_length"] = fitted_to_length
    if len(candidates) > 1:
        meta.training["search_results"] = [
            {
                "overrides": candidate.overrides,
                "validation_pr_auc": one.pr_auc,
                "step": one.result.step,
                "seconds": round(one.result.seconds, 1),  # the selection run's: only the kept one is refitted
                "kept": i == kept,
            }
            for i, (candidate, one) in enumerate(zip(candidates, selected, strict=True))
        ]
        log.info("search: kept candidate %d of %d (%s)", kept + 1, len(candidates), candidates[kept].overrides)
        # The kept candidate's settings, with the search and the budget as asked for.
        meta.training.update(settings.model_dump(mode="json", include={"search", "max_minutes"}))
    if signing_key is None:
        save_checkpoint(out, model, tokenizer, meta)
        return TrainResult(out, None, meta, time.monotonic() - started, validation_risks)

    from models.training.export import export_artifact

    checkpoint = Path(checkpoint_dir) if checkpoint_dir is not None else out.with_name(out.name + ".checkpoint")
    save_checkpoint(checkpoint, model, tokenizer, meta)
    progress.stage("exporting int8 ONNX and signing")
    artifact = export_artifact(
        checkpoint,
        out,
        version or datetime.now(UTC).strftime("%Y%m%d%H%M%S"),
        signing_key,
        calibration_windows=validation_encoded.ids,
        calibration_values=validation_encoded.values,
        min_agreement=settings.min_int8_agreement,
    )
    return TrainResult(checkpoint, artifact, meta, time.monotonic() - started, validation_risks)


def train(
    telemetry: str | Path,
    events: str | Path | None,
    out: str | Path,
    settings: TrainSettings,
    *,
    machines: str | Path | None = None,
    until: str | None = None,
    signing_key: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    version: str | None = None,
    progress: Progress = NO_PROGRESS,
    test_machines: MachineSplit | None = None,
    validation: Literal["time", "machines"] = "time",
) -> TrainResult:
    """The whole of ``precursor train``: read the files, split, then :func:`train_on_windows`.

    The machines ``test_machines`` holds out take no part in training or validation. ``validation``: ``time``
    validates on a period at the end of the data that holds its last failures; ``machines`` on a share of the
    machines, for a model that will predict machines it never saw (and data whose last period holds one class).
    """
    from models.training.dataset import parse_time

    started = time.monotonic()
    progress.stage("reading the fleet")
    fleet = Fleet.load(telemetry, events, machines)
    if test_machines is not None:
        fleet = fleet.only(lambda m: not test_machines.holds_out(m))
    split = choose_validation(
        fleet,
        validation,
        settings.horizon_h,
        until_s=parse_time(until) if until is not None else None,
        fraction=settings.validation_fraction,
        min_failures=settings.min_validation_failures,
    )
    progress.stage("cutting windows")
    train_windows, validation_windows = split_windows(fleet, settings.window_spec(), split)
    result = train_on_windows(
        train_windows,
        validation_windows,
        out,
        settings,
        data={
            "telemetry": str(Path(telemetry).resolve()),
            "events": str(Path(events).resolve()) if events is not None else None,
            "machines": str(Path(machines).resolve()) if machines is not None else None,
            "split": split.to_json(),
            **({"test_machines": test_machines.to_json()} if test_machines is not None else {}),
        },
        signing_key=signing_key,
        checkpoint_dir=checkpoint_dir,
        version=version,
        progress=progress,
    )
    result.seconds = time.monotonic() - started
    return result


def describe(meta: CheckpointMeta) -> str:
    """A few lines for the command line: what was trained and how it did on validation."""
    v = meta.validation
    chosen = f"best step {meta.step}" if meta.members == 1 else f"{meta.members} members averaged"
    refit = meta.training.get("refit")
    if refit:
        steps = "/".join(str(s) for s in refit.get("steps", []))
        chosen += f", then refit for {steps} steps on training + validation ({refit.get('windows', 0):,} windows)"
    searched = meta.training.get("search_results")
    if searched:
        scored = ", ".join(
            f"{json.dumps(r['overrides']) if r['overrides'] else 'as given'} {r['validation_pr_auc']:.3f}"
            + (" (kept)" if r["kept"] else "")
            for r in searched
        )
        chosen += f"; search on validation PR-AUC: {scored}"
    return (
        f"parameters {meta.parameters:,}; {chosen}; "
        f"validation PR-AUC {v.get('pr_auc', float('nan')):.3f}; "
        f"threshold {meta.threshold:.4g} (F1 {v.get('f1', float('nan')):.3f} on {v.get('failures', 0)} failures); "
        f"trained {meta.training.get('seconds', 0)} s"
    )
