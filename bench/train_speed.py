"""Training speed of the telemetry LM per device: the same data, model and steps on CPU threads and on a GPU.

Trains the default model (or ``--n-embd/--n-layer/--n-head``) on one dataset in the generic formats for exactly
``--steps`` steps per device (the default run's 600 unless told), side by side in one run, and prints per device:
the training loop's time (steps with a validation pass every 100) and steps per second, the whole ``train`` wall time
(reading files, cutting and tokenizing windows, training, choosing the threshold), the validation PR-AUC it reached,
and the speed-up of the loop against the first device.

    .venv/bin/python bench/train_speed.py --devices cpu                      # this machine
    python3 bench/train_speed.py --devices cpu,cuda --threads 1,16           # a cloud box with a GPU
    .venv/bin/python bench/train_speed.py --activations gelu_new,gelu_pytorch_tanh   # GELU kernels, same math
    .venv/bin/python bench/train_speed.py --output-layer everywhere,where-read       # logits where the loss reads them

Defaults are C-MAPSS FD001's training split with a 30-hour horizon.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from models.training.train import TrainSettings, train  # noqa: E402

FD001 = REPO_ROOT.parent / "shared" / "datasets" / "cmapss_fd001" / "train"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=FD001, help="folder with telemetry.csv, events.csv, machines.csv")
    parser.add_argument("--horizon", type=float, default=30.0, help="hours")
    parser.add_argument("--scaling", default="fleet")
    parser.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda, cuda:N")
    parser.add_argument("--threads", default="1", help="torch CPU threads, comma-separated: one run per value on cpu")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--n-embd", type=int, default=TrainSettings.model_fields["n_embd"].default)
    parser.add_argument("--n-layer", type=int, default=TrainSettings.model_fields["n_layer"].default)
    parser.add_argument("--n-head", type=int, default=TrainSettings.model_fields["n_head"].default)
    parser.add_argument(
        "--activations",
        default="",
        help="GPT-2 activation names, comma-separated: one run per name on each device (default: the model's own)",
    )
    parser.add_argument(
        "--output-layer",
        default="",
        help="where-read (the model's own: logits only where a loss reads them) and/or everywhere (every position's, "
        "then indexed, as before 2026-12-07), comma-separated: one run per value on each device",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    runs: list[tuple[str, int, str, str]] = []
    activations = args.activations.split(",") if args.activations else [""]
    layers = args.output_layer.split(",") if args.output_layer else [""]
    for device in args.devices.split(","):
        for activation in activations:
            for layer in layers:
                if device == "cpu":
                    runs += [("cpu", int(t), activation, layer) for t in args.threads.split(",")]
                else:
                    runs.append((device, 1, activation, layer))
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"date:    {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, GPU {gpu}; torch {torch.__version__}")
    print(f"load:    {os.getloadavg()[0]:.1f} (1 min) before")
    print(f"data:    {args.data}, horizon {args.horizon:g} h; {args.steps} steps of batch {args.batch_size}")
    rows = []
    for device, threads, activation, layer in runs:
        settings = TrainSettings(
            horizon_h=args.horizon,
            scaling=args.scaling,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            batch_size=args.batch_size,
            max_steps=args.steps,
            # validation every 100 steps, as a real run does: the figures are a real training run's
            max_minutes=600.0,
            threads=threads,
            device=device,
        )
        with tempfile.TemporaryDirectory(prefix="train-speed-") as out, built_with(activation), logits_at(layer):
            started = time.perf_counter()
            result = train(
                args.data / "telemetry.csv",
                args.data / "events.csv",
                Path(out) / "model",
                settings,
                machines=args.data / "machines.csv",
            )
            wall = time.perf_counter() - started
        history = result.meta.training["history"]
        loop_s = float(history[-1]["seconds"]) if history else float("nan")
        name = f"{device} x{threads}" if device == "cpu" else device
        name += "".join(f" {part}" for part in (activation, layer) if part)
        rows.append((name, loop_s, wall, result))
        print(f"  {rows[-1][0]}: loop {loop_s:.1f} s, train() {wall:.1f} s", flush=True)
    print(f"\nmodel: {rows[0][3].meta.parameters:,} parameters")
    print(f"{'run':<28} {'loop s':>8} {'steps/s':>8} {'speed-up':>9} {'train() s':>10} {'validation PR-AUC':>18}")
    for name, loop_s, wall, result in rows:
        pr_auc = result.meta.validation.get("pr_auc", float("nan"))
        speedup = rows[0][1] / loop_s
        print(f"{name:<28} {loop_s:>8.1f} {args.steps / loop_s:>8.2f} {speedup:>8.1f}x {wall:>10.1f} {pr_auc:>18.3f}")


@contextlib.contextmanager
def built_with(activation: str) -> Iterator[None]:
    """Models built inside get this GPT-2 ``activation_function`` (nothing changes for ""): the bench's switch only;
    the model's own is the one ``build_model`` sets."""
    if not activation:
        yield
        return
    from transformers import GPT2Config

    original = GPT2Config.__init__

    def init(self: GPT2Config, *a: object, **kw: object) -> None:
        original(self, *a, **kw)
        self.activation_function = activation

    GPT2Config.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        GPT2Config.__init__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def logits_at(layer: str) -> Iterator[None]:
    """``everywhere``: training and validation compute the logits at every position and index them, as before
    2026-12-07 (the same losses); "" or ``where-read``: the model's own path (models.training.model.hidden_and_head)."""
    if layer in ("", "where-read"):
        yield
        return
    if layer != "everywhere":
        raise SystemExit(f"--output-layer: {layer!r} is neither where-read nor everywhere")
    import models.training.model as model_module
    import models.training.train as train_module

    def every_position(model: Any, input_ids: Any, attention_mask: Any, values: Any = None) -> tuple[Any, Any]:
        extra = {} if values is None else {"values": values}
        return model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits, lambda logits: logits

    original = model_module.hidden_and_head
    model_module.hidden_and_head = train_module.hidden_and_head = every_position  # type: ignore[assignment]
    try:
        yield
    finally:
        model_module.hidden_and_head = train_module.hidden_and_head = original  # type: ignore[assignment]


if __name__ == "__main__":
    main()
