"""How far int8 moves a trained model's logits and risks from fp32 on this CPU: 8-bit weights against 7-bit.

ONNX Runtime's dynamic int8 multiplies uint8 activations by int8 weights. On x86 CPUs without VNNI (AVX2, or AVX-512
without VNNI) its kernel adds pairs of those products into 16 bits, which saturates when both are near full scale;
with VNNI, or on ARM, nothing saturates. Export quantizes weights to 7 bits (``reduce_range``) so that no CPU does.
This prints, side by side in one run, what each choice costs here: the largest and mean logit change against the fp32
graph, the largest change of the whole-failure risk, and the batched speed of each int8 graph.

    .venv/bin/python bench/int8_error.py --checkpoint runs/lm.checkpoint   # a checkpoint folder (repeatable)
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

from models.edge.outcome import risks_from_logits  # noqa: E402
from models.training.export import (  # noqa: E402
    _outcome_tokens,
    _run_batched,
    _session,
    export_onnx,
    load_checkpoint_model,
    quantize_int8,
    random_sequences,
    random_values,
    read_precursor_config,
)
from models.training.model import context_length, takes_values  # noqa: E402
from precursor.contracts.outcomes import ANY_FAILURE  # noqa: E402


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    isa = [f for f in ("avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{model}; {' '.join(isa) or 'no AVX2'}; VNNI {'yes' if flags & {'avx512_vnni', 'avx_vnni'} else 'no'}"


def compare(checkpoint: Path, count: int, work: Path) -> list[dict[str, float | str]]:
    model = load_checkpoint_model(checkpoint)
    config = read_precursor_config(checkpoint)
    length = context_length(model, config.get("context_length"))
    outcome_tokens = _outcome_tokens(checkpoint, config)
    sequences = random_sequences(int(model.get_output_embeddings().weight.shape[0]), length, count)
    values = random_values(sequences) if takes_values(model) else None
    fp32_path = work / f"{checkpoint.name}.fp32.onnx"
    export_onnx(model, fp32_path)
    reference = _run_batched(_session(fp32_path), sequences, length, values=values)
    reference_risk = np.array([r[ANY_FAILURE] for r in risks_from_logits(reference, outcome_tokens)])
    rows = []
    for label, full_range in (("int8, 8-bit weights (before)", True), ("int8, 7-bit weights (export)", False)):
        path = work / f"{checkpoint.name}.{'8' if full_range else '7'}bit.onnx"
        quantize_int8(fp32_path, path, full_range=full_range)
        session = _session(path)
        started = time.perf_counter()
        logits = _run_batched(session, sequences, length, values=values)
        seconds = time.perf_counter() - started
        risk = np.array([r[ANY_FAILURE] for r in risks_from_logits(logits, outcome_tokens)])
        rows.append(
            {
                "model": checkpoint.name,
                "graph": label,
                "max_logit": float(np.abs(logits - reference).max()),
                "mean_logit": float(np.abs(logits - reference).mean()),
                "max_risk": float(np.abs(risk - reference_risk).max()),
                "windows_per_s": len(sequences) / seconds,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, action="append", required=True, help="trained checkpoint folder")
    parser.add_argument("--windows", type=int, default=512, help="random token sequences of mixed length per model")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"CPU: {cpu_flags()}")
    with tempfile.TemporaryDirectory(prefix="int8-error-") as tmp:
        rows = [row for checkpoint in args.checkpoint for row in compare(checkpoint, args.windows, Path(tmp))]
    print("| model | graph | max abs logit change | mean abs logit change | max abs risk change | windows/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['graph']} | {r['max_logit']:.4f} | {r['mean_logit']:.5f} | {r['max_risk']:.4f} "
            f"| {r['windows_per_s']:,.0f} |"
        )


if __name__ == "__main__":
    main()
