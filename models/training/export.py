"""Export a trained checkpoint to a signed int8 ONNX artifact for the edge, and prove the export kept the model.

Steps: load the checkpoint (torch) -> ONNX fp32 (dynamic batch and sequence) -> check it matches torch -> int8
dynamic quantization -> check int8 makes the same alert decisions -> copy tokenizer and config -> write
``metrics.json`` -> sign the manifest. ``precursor.json`` carries the calibration map (:mod:`models.edge.calibration`),
so the signature covers it. The artifact is built in a staging folder and renamed into place only when
every check passed, so a failed export never leaves something that looks like an artifact.

GPT-2-style models (what training builds) are written straight from their weights as a compact graph whose attention
is ONNX Runtime's fused causal ``Attention`` op, which int8 quantization turns into ``QAttention``: about 60 nodes
instead of the ~600 the tracer emits for transformers' mask logic, and a fifth faster at the edge. Any other causal
LM goes through the legacy exporter (``torch.onnx.export(..., dynamo=False)``). Either way the parity check compares
the graph with the torch model, so a builder mistake cannot ship.

The ONNX graph takes ``input_ids`` (B, T) int64, right-padded, and ``last_index`` (B,) int64 (each row's last real
token), as :func:`models.edge.outcome.pack_sequences` makes them, and returns ``last_logits`` (B, V): the logits at that
position, the only one the risk needs. The final projection runs on B rows instead of B x T. A model with a value
channel (:class:`models.training.model.ValueGPT2LMHeadModel`) takes ``values`` (B, T) float32 as well;
``precursor.json`` lists the inputs under ``onnx.inputs``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn

from models.edge.calibration import IDENTITY, Calibration, calibration_of
from models.edge.outcome import pack_sequences, risks_from_logits
from models.edge.registry import CONFIG_FILE, DEFAULT_MODEL_NAME, VERSION_PATTERN, sign_artifact, staged_folder
from models.edge.scoring import Window
from models.edge.signing import load_private_key
from models.training.model import context_length, ensemble_members, load_causal_lm, takes_values
from precursor.contracts.outcomes import ANY_FAILURE

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
MODEL_FILE = "model.onnx"
FP32_MODEL_FILE = "model.fp32.onnx"
INPUT_NAMES = ("input_ids", "last_index")
VALUES_INPUT = "values"
OUTPUT_NAME = "last_logits"
OPSET = 17
"""Opset 17 has LayerNormalization as one op, and every ONNX Runtime from 1.14 on (the edge pins >= 1.20) runs it."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""Checkpoint files the artifact leaves out: the torch weights live on in the ONNX graph."""


class ExportParityError(RuntimeError):
    """The exported model does not behave like the checkpoint it came from."""


INT8_QUANTIZATION = "int8 dynamic (MatMul/Gemm/Attention weights; embeddings and output head fp32)"


class Int8DecisionError(ExportParityError):
    """int8 makes another alert decision than fp32 on too many windows; ``report`` has the figures."""

    def __init__(self, message: str, report: ParityReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class ParityReport:
    """How closely the exported graphs follow torch; goes into ``metrics.json`` under ``export``."""

    fp32_max_abs_logit_diff: float
    fp32_sequences: int
    int8_decision_agreement: float
    int8_max_abs_risk_diff: float
    int8_windows: int
    int8_windows_source: str
    threshold: float
    near_threshold: int
    """Windows whose fp32 risk lies within int8's largest error of the threshold: the ones int8 could flip."""


class LastTokenLogits(nn.Module):
    """Wrap a causal LM so it returns only the logits at each row's last real token: ``(B, T), (B,) -> (B, V)``;
    a model with a value channel takes ``values (B, T)`` as well.

    No attention mask is needed: a causal model never attends to the right, so the padding after a row's last real
    token cannot change what that token sees.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        base = getattr(model, "base_model", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        # Hugging Face causal LMs split into a body (ending in the final norm) and a head: run the head on B rows only.
        self.split = base is not None and base is not model and head is not None
        self.head = head if self.split else None

    def forward(
        self, input_ids: torch.Tensor, last_index: torch.Tensor, values: torch.Tensor | None = None
    ) -> torch.Tensor:
        last = last_index
        if values is not None and not takes_values(self.model):
            raise ValueError("values given to a model without a value channel")
        if self.split:
            # An all-ones mask: without one, transformers probes position ids for packed sequences (aten::diff, which
            # ONNX lacks); right padding needs no real mask.
            ones = torch.ones_like(input_ids)
            inputs: dict[str, torch.Tensor] = (
                {"input_ids": input_ids} if values is None else {"inputs_embeds": self.model.embed(input_ids, values)}
            )
            hidden = self.model.base_model(**inputs, attention_mask=ones, use_cache=False).last_hidden_state
            # hidden: (B, T, C)
            index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])  # (B, 1, C)
            return self.head(hidden.gather(1, index).squeeze(1))  # (B, V)
        out = self.model(input_ids) if values is None else self.model(input_ids, values=values)
        logits = out.logits if hasattr(out, "logits") else out[0]  # (B, T, V)
        index = last.view(-1, 1, 1).expand(-1, 1, logits.shape[-1])
        return logits.gather(1, index).squeeze(1)  # (B, V)


def load_checkpoint_model(checkpoint_dir: Path) -> nn.Module:
    """The torch model of a checkpoint folder, in eval mode, with attention the ONNX exporter can trace."""
    return load_causal_lm(checkpoint_dir, attn_implementation="eager").eval()


def read_precursor_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = checkpoint_dir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint_dir} has no {CONFIG_FILE} (model config, horizon, threshold)")
    config = json.loads(path.read_text())
    for key in ("threshold", "horizon_h"):
        if key not in config:
            raise ValueError(f"{path}: {key} is missing")
    return config


def export_onnx(model: nn.Module, path: Path, *, opset: int = OPSET) -> None:
    """Write the fp32 ONNX graph with dynamic batch and sequence axes: built directly for GPT-2, traced otherwise."""
    if all(is_plain_gpt2(member) for member in ensemble_members(model)):
        onnx.save(gpt2_graph(model), str(path))
        return
    if takes_values(model):
        raise ValueError(
            "a model with a value channel must be plain GPT-2 (models.training.model.ValueGPT2LMHeadModel)"
        )
    trace_onnx(model, path, opset=opset)


def trace_onnx(model: nn.Module, path: Path, *, opset: int = OPSET) -> None:
    """Any causal LM through the legacy TorchScript exporter."""
    wrapper = LastTokenLogits(model).eval()
    ids = torch.zeros((2, 8), dtype=torch.int64)
    last_index = torch.tensor([7, 4], dtype=torch.int64)
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (ids, last_index),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "last_index": {0: "batch"},
                OUTPUT_NAME: {0: "batch"},
            },
            opset_version=opset,
            dynamo=False,
        )


def is_plain_gpt2(model: nn.Module) -> bool:
    """A Hugging Face GPT-2 with the standard attention scaling and tanh GELU: what :func:`gpt2_graph` reproduces."""
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) == "gpt2"
        and config.activation_function in ("gelu_new", "gelu_pytorch_tanh")
        and config.scale_attn_weights
        and not config.scale_attn_by_inverse_layer_idx
        and not config.reorder_and_upcast_attn
        and not getattr(config, "add_cross_attention", False)
        and hasattr(model, "transformer")
    )


class _GraphBuilder:
    """Collects nodes and weights for one ONNX graph; each node is named after its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.prefix = ""
        """Put before every name made from here on (an ensemble's members each get their own); inputs keep theirs."""

    def weight(self, name: str, value: np.ndarray) -> str:
        name = self.prefix + name
        self.weights.append(onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, domain: str | None = None, **attrs: Any) -> str:
        output = self.prefix + output
        self.nodes.append(onnx.helper.make_node(op_type, inputs, [output], name=output, domain=domain, **attrs))
        return output


def gpt2_graph(model: nn.Module) -> onnx.ModelProto:
    """GPT-2 as ONNX, from its weights: ``input_ids (B, T), last_index (B,) [, values (B, T)] -> last_logits (B, V)``.

    Per block: LayerNorm -> fused causal Attention (com.microsoft, the GPT-2 qkv matrix as is) -> projection ->
    residual -> LayerNorm -> MLP with FastGelu (the tanh GELU GPT-2 uses) -> residual. Then each row's last real
    token is picked, normed and projected on the (tied) token embedding. An ensemble (:class:`EnsembleLM`) is its
    members side by side, each under its own name prefix, and ``last_logits`` is ``log(mean softmax)`` of theirs, as
    in torch.
    """
    members = ensemble_members(model)
    config = members[0].config
    g = _GraphBuilder()
    if len(members) == 1:
        _gpt2_member(g, members[0], OUTPUT_NAME)
    else:
        log_probs = []
        for i, member in enumerate(members):
            g.prefix = f"m{i}."
            logits = _gpt2_member(g, member, OUTPUT_NAME)
            log_probs.append(g.op("LogSoftmax", [logits], "log_probs", axis=-1))  # (B, V)
        g.prefix = ""
        axis0 = g.weight("axis0", np.array([0], np.int64))
        stacked = g.op("Concat", [g.op("Unsqueeze", [lp, axis0], f"{lp}_1") for lp in log_probs], "log_probs", axis=0)
        total = g.op("ReduceLogSumExp", [stacked], "log_prob_sum", axes=[0], keepdims=0)  # (B, V)
        g.op("Sub", [total, g.weight("log_members", np.array(math.log(len(members)), np.float32))], OUTPUT_NAME)

    inputs = [
        onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "sequence"]),
        onnx.helper.make_tensor_value_info("last_index", onnx.TensorProto.INT64, ["batch"]),
    ]
    if takes_values(model):
        inputs.append(onnx.helper.make_tensor_value_info(VALUES_INPUT, onnx.TensorProto.FLOAT, ["batch", "sequence"]))
    graph = onnx.helper.make_graph(
        g.nodes,
        "precursor-gpt2" if len(members) == 1 else f"precursor-gpt2-ensemble-{len(members)}",
        inputs,
        [onnx.helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT, ["batch", config.vocab_size])],
        g.weights,
    )
    opsets = [onnx.helper.make_opsetid("", OPSET), onnx.helper.make_opsetid("com.microsoft", 1)]
    built = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="precursor")
    onnx.checker.check_model(built)
    return built


def _gpt2_member(g: _GraphBuilder, model: nn.Module, output: str) -> str:
    """One GPT-2's nodes and weights, from the graph inputs to its logits ``(B, V)`` at ``output`` (prefixed)."""
    config = model.config
    weights = {k: v.detach().float().cpu().numpy() for k, v in model.transformer.state_dict().items()}
    head = model.get_output_embeddings().weight.detach().float().cpu().numpy()  # (V, C)
    eps = float(config.layer_norm_epsilon)
    zero, one = g.weight("zero", np.array(0, np.int64)), g.weight("one", np.array(1, np.int64))
    axis0 = g.weight("axis0", np.array([0], np.int64))
    flat = g.weight("flat_shape", np.array([-1, config.n_embd], np.int64))
    length_1d = g.op("Shape", ["input_ids"], "length_1d", start=1, end=2)
    length = g.op("Squeeze", [length_1d, axis0], "length")
    batch = g.op("Squeeze", [g.op("Shape", ["input_ids"], "batch_1d", start=0, end=1), axis0], "batch")
    tokens = g.op("Gather", [g.weight("wte", weights["wte.weight"]), "input_ids"], "tokens", axis=0)  # (B, T, C)
    valued = takes_values(model)
    if valued:  # wte[id] + value * wve[id]
        table = model.value_embedding.weight.detach().float().cpu().numpy()
        directions = g.op("Gather", [g.weight("wve", table), "input_ids"], "value_directions", axis=0)  # (B, T, C)
        last_axis = g.weight("last_axis", np.array([-1], np.int64))
        column = g.op("Unsqueeze", [VALUES_INPUT, last_axis], "value_column")  # (B, T, 1)
        tokens = g.op("Add", [tokens, g.op("Mul", [directions, column], "value_part")], "valued_tokens")
    # Slice, not Gather(Range): ONNX Runtime rewrites the latter into a Slice it then cannot run.
    positions = g.op("Slice", [g.weight("wpe", weights["wpe.weight"]), axis0, length_1d, axis0], "positions")
    h = g.op("Add", [tokens, positions], "embedded")  # (B, T, C)
    for i in range(config.n_layer):
        w = {k.removeprefix(f"h.{i}."): v for k, v in weights.items() if k.startswith(f"h.{i}.")}
        x = g.op(
            "LayerNormalization",
            [h, g.weight(f"h{i}.ln_1.g", w["ln_1.weight"]), g.weight(f"h{i}.ln_1.b", w["ln_1.bias"])],
            f"h{i}.ln_1",
            axis=-1,
            epsilon=eps,
        )
        x = g.op(
            "Attention",
            [x, g.weight(f"h{i}.qkv.w", w["attn.c_attn.weight"]), g.weight(f"h{i}.qkv.b", w["attn.c_attn.bias"])],
            f"h{i}.attention",
            domain="com.microsoft",
            num_heads=config.n_head,
            unidirectional=1,
        )  # (B, T, C)
        x = g.op("MatMul", [x, g.weight(f"h{i}.attn_out.w", w["attn.c_proj.weight"])], f"h{i}.attn_out")
        x = g.op("Add", [x, g.weight(f"h{i}.attn_out.b", w["attn.c_proj.bias"])], f"h{i}.attn_out_b")
        h = g.op("Add", [h, x], f"h{i}.residual_1")
        x = g.op(
            "LayerNormalization",
            [h, g.weight(f"h{i}.ln_2.g", w["ln_2.weight"]), g.weight(f"h{i}.ln_2.b", w["ln_2.bias"])],
            f"h{i}.ln_2",
            axis=-1,
            epsilon=eps,
        )
        x = g.op("MatMul", [x, g.weight(f"h{i}.fc.w", w["mlp.c_fc.weight"])], f"h{i}.fc")  # (B, T, 4C)
        x = g.op("FastGelu", [x, g.weight(f"h{i}.fc.b", w["mlp.c_fc.bias"])], f"h{i}.gelu", domain="com.microsoft")
        x = g.op("MatMul", [x, g.weight(f"h{i}.mlp_out.w", w["mlp.c_proj.weight"])], f"h{i}.mlp_out")
        x = g.op("Add", [x, g.weight(f"h{i}.mlp_out.b", w["mlp.c_proj.bias"])], f"h{i}.mlp_out_b")
        h = g.op("Add", [h, x], f"h{i}.residual_2")
    rows = g.op("Range", [zero, batch, one], "rows")
    row_start = g.op("Mul", [rows, length], "row_start")
    picked = g.op("Add", [row_start, "last_index"], "picked")  # index into the (B*T, C) view
    last = g.op("Gather", [g.op("Reshape", [h, flat], "flat_hidden"), picked], "last_hidden", axis=0)  # (B, C)
    last = g.op(
        "LayerNormalization",
        [last, g.weight("ln_f.g", weights["ln_f.weight"]), g.weight("ln_f.b", weights["ln_f.bias"])],
        "ln_f",
        axis=-1,
        epsilon=eps,
    )
    return g.op("MatMul", [last, g.weight("head.w", head.T)], output)  # (B, V)


def quantize_int8(fp32_path: Path, int8_path: Path, *, full_range: bool = False) -> None:
    """Dynamic int8: matrix weights (and the fused attention's qkv) stored as int8, activations quantized on the fly.

    Left in fp32, on purpose: the embedding tables (a lookup costs nothing, and GPT-2 ties the token table to the
    output head, whose few large outcome rows would set one int8 scale that flattens every other token's embedding)
    and the output head (it runs on one position per row, and its error lands straight in the risk).

    Weights in 7 bits (``reduce_range``): on x86 CPUs without VNNI (AVX2, or AVX-512 without VNNI: many edge boxes,
    and some of the machines this project runs on), ONNX Runtime multiplies uint8 activations by int8 weights with an
    instruction that adds pairs of products into 16 bits and saturates. With full 8-bit weights that moved the tiny
    test model's logits by up to 0.75 (calibrated risks by 0.12) on such a CPU, while the parity gate, run where the
    model was exported, may have had VNNI and passed. With 7 bits a pair of products cannot overflow: the same model
    moved by 0.06 on that CPU, which is what 8 bits give where nothing saturates. ``full_range`` quantizes to 8 bits
    as before, for bench/int8_error.py to compare on the CPU at hand.
    """
    graph = onnx.load(str(fp32_path), load_external_data=False).graph
    head = [  # the output head, or each ensemble member's (named <prefix>.last_logits)
        node.name
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm") and any(o.split(".")[-1] == OUTPUT_NAME for o in node.output)
    ]
    quantize_dynamic(
        fp32_path,
        int8_path,
        op_types_to_quantize=["MatMul", "Gemm", "Attention"],
        nodes_to_exclude=head,
        per_channel=True,
        weight_type=QuantType.QInt8,
        reduce_range=not full_range,
        # ONNX shape inference cannot type the outputs of ONNX Runtime's own ops (com.microsoft): they are float.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run_batched(
    session: ort.InferenceSession,
    sequences: Sequence[Sequence[int]],
    max_len: int,
    batch: int = 64,
    *,
    values: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    out = []
    for start in range(0, len(sequences), batch):
        part = None if values is None else values[start : start + batch]
        packed = pack_sequences(sequences[start : start + batch], pad_id=0, max_length=max_len, values=part)
        feeds = {"input_ids": packed.input_ids, "last_index": packed.last_index}
        if packed.values is not None:
            feeds[VALUES_INPUT] = packed.values
        out.append(session.run([OUTPUT_NAME], feeds)[0])
    return np.concatenate(out)


def _torch_last_logits(
    model: nn.Module, sequences: Sequence[Sequence[int]], values: Sequence[np.ndarray] | None = None
) -> np.ndarray:
    """The reference: each sequence alone, unpadded, through the full torch forward."""
    rows = []
    with torch.no_grad():
        for i, seq in enumerate(sequences):
            extra = {} if values is None else {"values": torch.tensor(np.asarray(values[i], np.float32)[None, :])}
            out = model(torch.tensor([list(seq)], dtype=torch.int64), **extra)
            logits = out.logits if hasattr(out, "logits") else out[0]
            rows.append(logits[0, -1].float().numpy())
    return np.stack(rows)


def random_sequences(vocab_size: int, max_len: int, count: int, seed: int = 0) -> list[list[int]]:
    """Token sequences of mixed lengths (1 to ``max_len``), so padding and the last-token gather get exercised."""
    rng = np.random.default_rng(seed)
    lengths = [1, max_len, *rng.integers(1, max_len + 1, max(0, count - 2)).tolist()]
    return [rng.integers(0, vocab_size, int(n)).tolist() for n in lengths]


def random_values(sequences: Sequence[Sequence[int]], seed: int = 0) -> list[np.ndarray]:
    """A value beside every id, of the size :func:`models.edge.tokenizer.token_value` gives (about -5 to 5)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 2.0, len(s)).astype(np.float32) for s in sequences]


def check_parity(
    model: nn.Module,
    fp32_path: Path,
    int8_path: Path,
    *,
    vocab_size: int,
    max_len: int,
    outcome_tokens: dict[str, int],
    threshold: float,
    decision_sequences: Sequence[Sequence[int]] | None,
    decision_values: Sequence[np.ndarray] | None = None,
    tolerance: float = 1e-4,
    min_agreement: float = 0.99,
    calibration: Calibration = IDENTITY,
) -> ParityReport:
    """fp32 ONNX within ``tolerance`` of torch; int8 the same alert decision as fp32 on ``min_agreement`` of windows.

    ``threshold`` is on ``calibration``'s scale (the identity for an uncalibrated checkpoint), as ``precursor.json``
    keeps it. ``decision_sequences`` should be validation windows: random tokens make a weak witness for decisions
    (their risks sit far from any threshold), so they are used only when nothing better is given, and the report
    says so.
    """
    probe = random_sequences(vocab_size, max_len, count=24)
    probe_values = random_values(probe) if takes_values(model) else None
    reference = _torch_last_logits(model, probe, probe_values)
    fp32 = _session(fp32_path)
    fp32_diff = float(np.abs(_run_batched(fp32, probe, max_len, values=probe_values) - reference).max())
    if not fp32_diff <= tolerance:
        raise ExportParityError(f"ONNX fp32 logits differ from torch by {fp32_diff:.3g} > tolerance {tolerance:g}")

    source = "validation windows" if decision_sequences else "random token sequences"
    windows = list(decision_sequences) if decision_sequences else probe
    values = (decision_values if decision_sequences else probe_values) if takes_values(model) else None
    if takes_values(model) and values is None:
        raise ValueError("the model has a value channel: decision_sequences need decision_values beside them")
    int8 = _session(int8_path)
    # On the calibrated scale, where the threshold lives: the edge compares calibrated risks with it.
    risk_fp32 = calibration.probabilities(
        [r[ANY_FAILURE] for r in risks_from_logits(_run_batched(fp32, windows, max_len, values=values), outcome_tokens)]
    )
    risk_int8 = calibration.probabilities(
        [r[ANY_FAILURE] for r in risks_from_logits(_run_batched(int8, windows, max_len, values=values), outcome_tokens)]
    )
    agreement = float(np.mean((risk_fp32 >= threshold) == (risk_int8 >= threshold)))
    max_risk_diff = float(np.abs(risk_fp32 - risk_int8).max())
    report = ParityReport(
        fp32_max_abs_logit_diff=fp32_diff,
        fp32_sequences=len(probe),
        int8_decision_agreement=agreement,
        int8_max_abs_risk_diff=max_risk_diff,
        int8_windows=len(windows),
        int8_windows_source=source,
        threshold=threshold,
        near_threshold=int(np.sum(np.abs(risk_fp32 - threshold) <= max_risk_diff)),
    )
    if agreement < min_agreement:
        raise Int8DecisionError(
            f"int8 agrees with fp32 on the alert decision for {agreement:.1%} of {len(windows)} {source}, "
            f"below {min_agreement:.0%}; {report.near_threshold} windows have an fp32 risk within int8's largest "
            f"error ({max_risk_diff:.2g}) of threshold={threshold:.6g} (a threshold inside a dense cluster of "
            f"risks flips them all; choose it between two distinct validation risks): {report}",
            report,
        )
    return report


def _encode_windows(
    checkpoint_dir: Path, windows: Sequence[Window] | Sequence[Sequence[int]], *, values: bool
) -> tuple[list[list[int]], list[np.ndarray] | None]:
    """Calibration windows as ids (and values, for a model with a value channel); ids pass through."""
    if all(isinstance(w, Window) for w in windows):
        from models.edge.tokenizer import TelemetryTokenizer

        tokenizer = TelemetryTokenizer.load(checkpoint_dir)
        if values:
            encoded = tokenizer.encode_with_values(windows)  # type: ignore[arg-type]
            return encoded.ids, encoded.values
        return [list(tokenizer.encode(w)) for w in windows], None  # type: ignore[arg-type]
    return [list(map(int, w)) for w in windows], None  # type: ignore[arg-type]


def _outcome_tokens(checkpoint_dir: Path, config: dict[str, Any]) -> dict[str, int]:
    if isinstance(config.get("outcome_tokens"), dict):
        return {str(k): int(v) for k, v in config["outcome_tokens"].items()}
    from models.edge.tokenizer import TelemetryTokenizer

    return dict(TelemetryTokenizer.load(checkpoint_dir).outcome_tokens)


def export_artifact(
    checkpoint_dir: Path | str,
    out_dir: Path | str,
    version: str,
    signing_key: Ed25519PrivateKey | Path | str,
    calibration_windows: Sequence[Window] | Sequence[Sequence[int]] | None = None,
    *,
    calibration_values: Sequence[np.ndarray] | None = None,
    model_name: str | None = None,
    include_fp32: bool = False,
    tolerance: float = 1e-4,
    min_agreement: float = 0.99,
    int8_fallback: bool = True,
) -> Path:
    """Build the signed artifact folder ``out_dir`` from a checkpoint; return its path.

    ``calibration_windows`` (validation windows, or their token ids) are where int8 must make the same alert decision
    as fp32; token ids for a model with a value channel need ``calibration_values`` beside them. ``signing_key`` is a
    private key or the path of one. ``out_dir`` must not exist yet (or be empty).

    Where int8 makes another decision than fp32 on more than ``1 - min_agreement`` of the windows, the artifact
    carries the fp32 graph instead (``int8_fallback``; ``precursor.json`` and ``metrics.json`` say so): a model that
    trained well is not lost to a threshold that sits in a dense cluster of risks. An fp32 graph that differs from
    torch is always refused.
    """
    checkpoint_dir = Path(checkpoint_dir)
    out_dir = Path(out_dir)
    if not re.match(VERSION_PATTERN, version):
        raise ValueError(f"version={version!r} does not match {VERSION_PATTERN}")
    if not tolerance >= 0.0:
        raise ValueError(f"tolerance={tolerance} must be at least 0")
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement={min_agreement} must lie in [0, 1]")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"export destination {out_dir} exists and is not an empty directory")
    private_key = signing_key if isinstance(signing_key, Ed25519PrivateKey) else load_private_key(signing_key)
    config = read_precursor_config(checkpoint_dir)
    outcome_tokens = _outcome_tokens(checkpoint_dir, config)
    model = load_checkpoint_model(checkpoint_dir)
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    max_len = context_length(model, config.get("context_length"))
    valued = takes_values(model)
    decision_sequences, decision_values = (
        _encode_windows(checkpoint_dir, calibration_windows, values=valued) if calibration_windows else (None, None)
    )
    if calibration_values is not None:
        decision_values = list(calibration_values)

    with staged_folder(out_dir, "exporting") as staging:
        with tempfile.TemporaryDirectory(prefix="precursor-export-") as scratch:
            fp32_path = Path(scratch) / FP32_MODEL_FILE
            export_onnx(model, fp32_path)
            quantize_int8(fp32_path, staging / MODEL_FILE)
            quantization = INT8_QUANTIZATION
            try:
                report = check_parity(
                    model,
                    fp32_path,
                    staging / MODEL_FILE,
                    vocab_size=vocab_size,
                    max_len=max_len,
                    outcome_tokens=outcome_tokens,
                    threshold=float(config["threshold"]),
                    decision_sequences=decision_sequences,
                    decision_values=decision_values,
                    tolerance=tolerance,
                    min_agreement=min_agreement,
                    calibration=calibration_of(config),
                )
            except Int8DecisionError as err:
                if not int8_fallback:
                    raise
                report = err.report
                quantization = (
                    f"none: fp32, since int8 agreed with it on the alert decision for "
                    f"{report.int8_decision_agreement:.1%} of {report.int8_windows} {report.int8_windows_source} "
                    f"(below {min_agreement:.0%})"
                )
                log.warning("export of %s keeps the fp32 graph: %s", checkpoint_dir, err)
                shutil.copy2(fp32_path, staging / MODEL_FILE)
            if include_fp32:
                shutil.copy2(fp32_path, staging / FP32_MODEL_FILE)
        _copy_checkpoint_files(checkpoint_dir, staging)
        config["onnx"] = {
            "model_file": MODEL_FILE,
            "inputs": [*INPUT_NAMES, VALUES_INPUT] if valued else list(INPUT_NAMES),
            "output": OUTPUT_NAME,
            "opset": OPSET,
            "quantization": quantization,
            "context_length": max_len,
            "vocab_size": vocab_size,
            "outcome_tokens": outcome_tokens,
        }
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        metrics = _checkpoint_metrics(checkpoint_dir, config)
        metrics["export"] = asdict(report)
        (staging / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        sign_artifact(
            staging,
            model_name=model_name or str(config.get("model_name", DEFAULT_MODEL_NAME)),
            version=version,
            private_key=private_key,
        )
    log.info("exported %s version %s: %s", checkpoint_dir, version, report)
    return out_dir


def _copy_checkpoint_files(checkpoint_dir: Path, staging: Path) -> None:
    """Tokenizer files, configs and anything else small at the checkpoint's top level; never the torch weights."""
    for path in sorted(checkpoint_dir.iterdir()):
        if path.is_file() and not path.is_symlink() and not path.name.endswith(WEIGHT_SUFFIXES):
            if path.name in (CONFIG_FILE, METRICS_FILE, MODEL_FILE, FP32_MODEL_FILE):
                continue
            shutil.copy2(path, staging / path.name)


def _checkpoint_metrics(checkpoint_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    metrics_path = checkpoint_dir / METRICS_FILE
    metrics: dict[str, Any] = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    if isinstance(config.get("metrics"), dict):
        metrics = {**config["metrics"], **metrics}
    return metrics
