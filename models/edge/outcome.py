"""How a token sequence becomes a risk: packing sequences for the model, and reading the outcome from its logits.

Both sides use these functions, so training, torch evaluation, ONNX export and the edge runtime agree exactly:

- a tokenizer's sequence ends with the horizon token; the model's next-token distribution at that last position,
  restricted to the outcome tokens (``<ok>``, ``<failure>``, ``<failure:KIND>``), is the outcome distribution;
- ``risk[KIND] = p(KIND)`` and ``risk["failure"] = 1 - p(ok)`` (any failure), softmax over outcome tokens only;
- sequences longer than the model's context are cut from the left (the oldest tokens go first; the tokenizer already
  budgets its sequences, so this is a guard, not the normal path);
- a batch is right-padded: real tokens keep positions ``0..n-1`` (absolute position embeddings see the same input
  whether a sequence is scored alone or in a batch) and the risk is read at ``last_index = n - 1``.

Numpy only: the edge imports this.

>>> import numpy as np
>>> outcome_tokens = {"ok": 5, "failure": 6, "bearing": 7}
>>> logits = np.zeros(9, dtype=np.float32); logits[5] = np.log(6.0); logits[7] = np.log(3.0)
>>> {k: round(v, 3) for k, v in risk_from_logits(logits, outcome_tokens).items()}
{'failure': 0.4, 'bearing': 0.3}
>>> batch = pack_sequences([[1, 2, 3], [4]], pad_id=0, max_length=2)
>>> batch.input_ids.tolist(), batch.attention_mask.tolist(), batch.last_index.tolist()
([[2, 3], [4, 0]], [[1, 1], [1, 0]], [1, 0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models.edge.scoring import Risk
from precursor.contracts.outcomes import ANY_FAILURE, OK


def outcome_token(kind: str) -> str:
    """The token text of an outcome: ``<ok>``, ``<failure>`` (unnamed kind) or ``<failure:KIND>``.

    >>> outcome_token("ok"), outcome_token("failure"), outcome_token("bearing")
    ('<ok>', '<failure>', '<failure:bearing>')
    """
    if kind == OK:
        return "<ok>"
    if kind == ANY_FAILURE:
        return "<failure>"
    return f"<failure:{kind}>"


def outcome_probabilities(logits_last: np.ndarray, outcome_tokens: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Outcome -> probability for a batch of last-position logits ``(B, V)`` (or one ``(V,)`` vector).

    Softmax over the outcome tokens only: the model's mass on any other token is ignored, not counted as risk.
    """
    if OK not in outcome_tokens:
        raise ValueError(f"outcome_tokens has no {OK!r} entry: {sorted(outcome_tokens)}")
    kinds = list(outcome_tokens)
    ids = np.array([outcome_tokens[k] for k in kinds], dtype=np.int64)
    logits = np.asarray(logits_last, dtype=np.float64)
    picked = logits[..., ids]  # (B, K) or (K,)
    picked = picked - picked.max(axis=-1, keepdims=True)
    exp = np.exp(picked)
    probs = exp / exp.sum(axis=-1, keepdims=True)
    return {kind: probs[..., i] for i, kind in enumerate(kinds)}


def risk_from_logits(logits_last: np.ndarray, outcome_tokens: Mapping[str, int]) -> Risk:
    """The risk of one sequence from its last-position logits ``(V,)``: ``p(KIND)`` per kind, 1 - p(ok) for any."""
    if np.asarray(logits_last).ndim != 1:
        raise ValueError(f"logits_last must be one vector (V,), got shape {np.asarray(logits_last).shape}")
    return risks_from_logits(np.asarray(logits_last)[None, :], outcome_tokens)[0]


def risks_from_logits(logits_last: np.ndarray, outcome_tokens: Mapping[str, int]) -> list[Risk]:
    """:func:`risk_from_logits` for a batch ``(B, V)``."""
    probs = outcome_probabilities(logits_last, outcome_tokens)
    any_failure = 1.0 - probs[OK]
    risks: list[Risk] = []
    for b in range(len(any_failure)):
        risk = {ANY_FAILURE: float(min(1.0, max(0.0, any_failure[b])))}
        for kind, p in probs.items():
            if kind not in (OK, ANY_FAILURE):
                risk[kind] = float(p[b])
        risks.append(risk)
    return risks


def truncate_left(ids: Sequence[int], max_length: int) -> list[int]:
    """The last ``max_length`` ids: the horizon token at the end is always kept."""
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    return list(ids[-max_length:])


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded token ids for a batch: ``input_ids`` and ``attention_mask`` are ``(B, L)`` int64."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    last_index: np.ndarray  # (B,) index of each sequence's last real token: where its risk is read
    values: np.ndarray | None = None  # (B, L) float32 beside the ids, for a model with a value channel; 0 in padding

    def last_logits(self, logits: np.ndarray) -> np.ndarray:
        """The logits ``(B, V)`` at each sequence's last real position, from the model's ``(B, L, V)`` output."""
        return logits[np.arange(len(self.last_index)), self.last_index]


def pack_sequences(
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    max_length: int,
    *,
    values: Sequence[Sequence[float] | np.ndarray] | None = None,
) -> PackedBatch:
    """Left-truncate each sequence to ``max_length``, then right-pad the batch to its longest member; ``values``
    (one per id) are cut and padded the same way."""
    if not sequences:
        raise ValueError("pack_sequences needs at least one sequence")
    if values is not None and (
        len(values) != len(sequences) or any(len(v) != len(s) for v, s in zip(values, sequences, strict=False))
    ):
        raise ValueError("pack_sequences: values must have one entry per id of every sequence")
    cut = [truncate_left(s, max_length) for s in sequences]
    if any(len(s) == 0 for s in cut):
        raise ValueError("pack_sequences got an empty sequence")
    width = max(len(s) for s in cut)
    input_ids = np.full((len(cut), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(cut), width), dtype=np.int64)
    for i, s in enumerate(cut):
        input_ids[i, : len(s)] = s
        attention_mask[i, : len(s)] = 1
    last_index = np.array([len(s) - 1 for s in cut], dtype=np.int64)
    packed_values = None
    if values is not None:
        packed_values = np.zeros((len(cut), width), dtype=np.float32)
        for i, (v, s) in enumerate(zip(values, cut, strict=True)):
            packed_values[i, : len(s)] = np.asarray(v, dtype=np.float32)[len(v) - len(s) :]
    return PackedBatch(input_ids, attention_mask, last_index, packed_values)
