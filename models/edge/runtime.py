"""The edge runtime: score windows with a signed int8 ONNX artifact, using onnxruntime, numpy and tokenizers only.

Nothing here imports torch or transformers, directly or through another module: the edge install has neither.
:meth:`LMScorer.load` verifies the artifact (signature, every file's hash, nothing added or missing) before it reads
anything from it, and hands ONNX Runtime the very model bytes it hashed, so a file swapped after the check is caught.
Risks come out through the artifact's signed calibration map (the identity for an artifact made without one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from models.edge.calibration import Calibration, calibration_of
from models.edge.outcome import pack_sequences, risks_from_logits
from models.edge.registry import CONFIG_FILE, ArtifactError, ArtifactManifest, read_verified_file, verify_artifact
from models.edge.scoring import Risk, Window
from models.edge.signing import TrustedKeys

DEFAULT_MAX_BATCH = 16
"""The edge agent's default too (``model.max_batch``). Measured on the edge bench (one core, 1,000 machines, a window
per machine a minute): 16 gave the least CPU per reading with a p99 as low as any; 8 cost about 15% more CPU (each
batch tokenizes and runs once, whatever its size) for no better p99, and 32 saved a little CPU but not p99."""


class WindowTokenizer(Protocol):
    """What the runtime needs from a tokenizer: a window to token ids. One that also has ``encode_many(windows)``
    (the ids of each, as :class:`models.edge.tokenizer.TelemetryTokenizer` has) gets a batch's windows at once."""

    def encode(self, window: Window) -> list[int]: ...


class ValuedSequencesLike(Protocol):
    ids: list[list[int]]
    values: list[np.ndarray]


class LMScorer:
    """A :class:`~models.edge.scoring.Scorer` backed by the telemetry language model in ONNX form.

    ``score_many`` pads a batch on the right and reads each row's logits at its last real token; rows are grouped by
    length so short windows do not pay for long ones. Dynamic int8 quantizes activations with one scale per batch, so
    a window's risk can move by about 1e-3 with its batch-mates; the same windows always get the same risks.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        tokenizer: WindowTokenizer,
        manifest: ArtifactManifest,
        config: Mapping[str, Any],
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH,
    ) -> None:
        onnx = config.get("onnx")
        if not isinstance(onnx, dict):
            raise ArtifactError(
                f"{CONFIG_FILE} has no 'onnx' section: the artifact was not made by models.training.export"
            )
        self.name: str = manifest.model_name
        self.version: str = manifest.version
        self.horizon_h: float = float(config["horizon_h"])
        self.threshold: float = float(config["threshold"])  # on the calibrated scale, as the risks are
        try:
            self.calibration: Calibration = calibration_of(config)
        except ValueError as e:
            raise ArtifactError(str(e)) from e
        self.sha256: str = manifest.files[str(onnx["model_file"])].sha256
        self.context_length: int = int(onnx["context_length"])
        self.outcome_tokens: dict[str, int] = {str(k): int(v) for k, v in onnx["outcome_tokens"].items()}
        self.max_batch_size = max_batch_size
        self._session = session
        self._tokenizer = tokenizer
        inputs = [str(name) for name in onnx["inputs"]]
        self._input_ids, self._last_index = inputs[:2]
        # A model with a value channel also takes each token's value (models.edge.tokenizer.token_value).
        self._values: str | None = inputs[2] if len(inputs) > 2 else None
        if self._values is not None and not hasattr(tokenizer, "encode_with_values"):
            raise ArtifactError(f"the model takes {self._values!r}: its tokenizer must have encode_with_values")
        self._output = str(onnx["output"])

    @classmethod
    def load(
        cls,
        artifact_dir: Path | str,
        trusted_keys: TrustedKeys,
        *,
        intra_op_num_threads: int = 1,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        tokenizer: WindowTokenizer | None = None,
    ) -> LMScorer:
        """Verify the artifact, open its int8 model and tokenizer, and warm up with one inference.

        ``tokenizer`` defaults to the artifact's own :class:`models.edge.tokenizer.TelemetryTokenizer`.
        """
        manifest = verify_artifact(artifact_dir, trusted_keys)
        return cls.from_verified(
            artifact_dir,
            manifest,
            intra_op_num_threads=intra_op_num_threads,
            max_batch_size=max_batch_size,
            tokenizer=tokenizer,
        )

    @classmethod
    def from_verified(
        cls,
        artifact_dir: Path | str,
        manifest: ArtifactManifest,
        *,
        intra_op_num_threads: int = 1,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        tokenizer: WindowTokenizer | None = None,
    ) -> LMScorer:
        """:meth:`load` for an artifact whose ``manifest`` the caller has just verified
        (:func:`models.edge.registry.verify_artifact` or :func:`~models.edge.registry.verify_release`), so it is not
        verified twice; each file is still checked against the manifest as it is read."""
        if intra_op_num_threads < 1:
            raise ValueError(f"intra_op_num_threads={intra_op_num_threads} must be at least 1")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be at least 1")
        artifact_dir = Path(artifact_dir)
        config = json.loads(read_verified_file(artifact_dir, CONFIG_FILE, manifest))
        model_file = str(config.get("onnx", {}).get("model_file", "model.onnx"))
        model_bytes = read_verified_file(artifact_dir, model_file, manifest)

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_num_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        if tokenizer is None:
            from models.edge.tokenizer import TelemetryTokenizer

            tokenizer = TelemetryTokenizer.load(artifact_dir)
        scorer = cls(session, tokenizer, manifest, config, max_batch_size=max_batch_size)
        scorer.warm_up()
        return scorer

    @property
    def tokenizer(self) -> WindowTokenizer:
        """The artifact's tokenizer (what :mod:`models.edge.explain` reads a window's token layout from)."""
        return self._tokenizer

    @property
    def takes_values(self) -> bool:
        """Whether the model reads a value beside each token id (a value channel)."""
        return self._values is not None

    def warm_up(self) -> None:
        """One inference, so the first real window does not pay for ONNX Runtime's lazy set-up."""
        length = min(8, self.context_length)
        self.score_token_ids([[0] * length], [np.zeros(length, np.float32)] if self.takes_values else None)

    def score(self, window: Window) -> Risk:
        return self.score_many([window])[0]

    def score_many(self, windows: Sequence[Window]) -> list[Risk]:
        if self._values is not None:
            encoded: ValuedSequencesLike = self._tokenizer.encode_with_values(windows)  # type: ignore[attr-defined]
            return self.score_token_ids(encoded.ids, encoded.values)
        encode_many = getattr(self._tokenizer, "encode_many", None)
        if encode_many is not None:  # the same ids, a batch's statistics worked out together
            return self.score_token_ids(encode_many(windows))
        return self.score_token_ids([self._tokenizer.encode(w) for w in windows])

    def score_token_ids(
        self,
        sequences: Sequence[Sequence[int]],
        values: Sequence[np.ndarray] | None = None,
        *,
        batch_size: int | None = None,
    ) -> list[Risk]:
        """Risks for already-tokenized windows (and the values beside their ids, for a model that takes them);
        sequences longer than the context keep their end. ``batch_size`` (default ``max_batch_size``): rows per
        inference; risks meant to be compared with each other (an explanation's variants) go in one."""
        if not sequences:
            return []
        if (values is None) == self.takes_values:
            wanted = "needs" if self.takes_values else "takes no"
            raise ValueError(f"this model {wanted} values beside the token ids")
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        risks: list[Risk | None] = [None] * len(sequences)
        step = self.max_batch_size if batch_size is None else max(1, batch_size)
        for start in range(0, len(order), step):
            rows = order[start : start + step]
            packed = pack_sequences(
                [sequences[i] for i in rows],
                pad_id=0,
                max_length=self.context_length,
                values=None if values is None else [values[i] for i in rows],
            )
            feeds = {self._input_ids: packed.input_ids, self._last_index: packed.last_index}
            if self._values is not None:
                feeds[self._values] = packed.values
            logits = self._session.run([self._output], feeds)[0]
            calibrated = self.calibration.apply_many(risks_from_logits(logits, self.outcome_tokens))
            for row, risk in zip(rows, calibrated, strict=True):
                risks[row] = risk
        return [r for r in risks if r is not None]

    def __repr__(self) -> str:
        return f"LMScorer(name={self.name!r}, version={self.version!r}, horizon_h={self.horizon_h})"
