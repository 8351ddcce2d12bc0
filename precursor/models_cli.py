"""``precursor train`` and ``precursor evaluate``: the language model on the generic formats, from the command line.

Torch, transformers and scikit-learn are imported inside the commands, so ``precursor --help`` stays quick.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from models.training.progress import NO_PROGRESS, Progress
from precursor.common import fail
from precursor.contracts.durations import parse_duration

log = logging.getLogger(__name__)


QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars on stderr.")]
ProgressOption = Annotated[
    bool, typer.Option("--progress", help="Progress bars on stderr even when it is not a terminal (a log, a pipe).")
]


def _progress(quiet: bool, force: bool) -> AbstractContextManager[Progress]:
    """Bars on stderr for a person at a terminal (stdout stays exactly what it is without them)."""
    from models.training.progress import TerminalProgress, wanted

    return TerminalProgress() if wanted(quiet=quiet, force=force) else nullcontext(NO_PROGRESS)


def _hours(value: str, option: str) -> float:
    try:
        hours = parse_duration(value).total_seconds() / 3600
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint=option) from None
    if hours <= 0:
        raise typer.BadParameter(f"{value!r} must be a positive duration", param_hint=option)
    return hours


def _stats(value: str, option: str) -> tuple[str, ...]:
    from models.edge.features import STATISTICS

    names = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in names if s not in STATISTICS]
    if unknown:
        raise typer.BadParameter(
            f"unknown statistic(s) {unknown}; choose from {', '.join(STATISTICS)}", param_hint=option
        )
    return names


def _settings_overrides(pairs: list[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` pairs; TrainSettings validates names and values (extra names are refused there). A value
    in JSON brackets is a list or mapping (``--set 'search=[{"blocks": 2}]'``); any other stays text for pydantic."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"{pair!r}: expected NAME=VALUE", param_hint="--set")
        parsed: Any = value.strip()
        if parsed[:1] in ("[", "{"):
            try:
                parsed = json.loads(parsed)
            except json.JSONDecodeError as err:
                raise typer.BadParameter(f"{pair!r}: not valid JSON: {err}", param_hint="--set") from None
        out[name.strip().replace("-", "_")] = parsed
    return out


def train_command(
    telemetry: Annotated[
        Path, typer.Option(help="Telemetry file (CSV, JSONL or Parquet): timestamp, machine_id, sensors.")
    ],
    events: Annotated[Path, typer.Option(help="Events file: timestamp, machine_id, event (failure[:KIND], ...).")],
    out: Annotated[Path, typer.Option(help="Folder to write the model into (the signed artifact with --signing-key).")],
    machines: Annotated[Path | None, typer.Option(help="Machines file: machine_id plus static attributes.")] = None,
    horizon: Annotated[
        str, typer.Option(help="Predict a failure within this long after a window: 24h, 30h, 2d.")
    ] = "24h",
    until: Annotated[
        str | None, typer.Option(help="Use only data before this time (ISO 8601 or epoch seconds); test after it.")
    ] = None,
    test_machines: Annotated[
        str | None,
        typer.Option(
            help="Hold these machines out for test: a fraction (0.3: chosen by a hash of the machine id, the same "
            "every run) or a file of machine ids; `precursor evaluate` then tests on them."
        ),
    ] = None,
    validation: Annotated[
        str | None,
        typer.Option(
            help="time: choose steps and the alert threshold on a period at the end of the data that holds its last "
            "failures; machines: on a share of the training machines, kept out of training (for predicting new "
            "machines, or data whose last period holds one class). Default: machines with --test-machines (the test "
            "machines are new), else time."
        ),
    ] = None,
    window: Annotated[str | None, typer.Option(help="Window length (default: the horizon).")] = None,
    every: Annotated[str, typer.Option(help="A window ends every this long, per machine.")] = "1h",
    scaling: Annotated[
        str | None,
        typer.Option(
            help="machine: each machine scaled by its own training statistics (for predicting machines seen in "
            "training); fleet: one scaling per sensor (for predicting new machines). Default: fleet with "
            "--test-machines (the test machines are new), else machine."
        ),
    ] = None,
    blocks: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=32,
            help="Blocks a window is cut into (default 4, fewer where the sensors would leave a sequence's fixed part "
            "too little of --max-length; precursor.json says so under training.fitted_to_length).",
        ),
    ] = None,
    block_stats: Annotated[
        str | None, typer.Option(help="Statistics per block and sensor, comma-separated (default: mean).")
    ] = None,
    window_stats: Annotated[
        str | None,
        typer.Option(
            help="Statistics per sensor over the whole window, comma-separated, may be empty (default: slope,std; "
            "slope alone where one block of the sensors would not leave room)."
        ),
    ] = None,
    daily_profile: Annotated[
        bool,
        typer.Option(
            "--daily-profile/--no-daily-profile",
            help="Take each machine's usual hour-of-day profile out of its readings before binning (for load cycles).",
        ),
    ] = False,
    max_length: Annotated[int, typer.Option(min=8, help="Longest token sequence (the model's context).")] = 256,
    seed: Annotated[int, typer.Option(help="Random seed (weights, batch order).")] = 0,
    members: Annotated[
        int,
        typer.Option(
            min=1,
            max=16,
            help="Train this many models, from seeds --seed, --seed + 1, ..., and average them into one (an ensemble, "
            "one ONNX graph at the edge); --max-minutes is shared among them.",
        ),
    ] = 1,
    max_minutes: Annotated[
        float, typer.Option(min=0.01, help="Training time budget, a cap (the selection run and the refit share it).")
    ] = 16.0,
    max_steps: Annotated[int, typer.Option(min=1, help="Most optimisation steps.")] = 600,
    n_layer: Annotated[int, typer.Option(min=1, help="Transformer layers.")] = 2,
    n_embd: Annotated[int, typer.Option(min=8, help="Model width.")] = 64,
    n_head: Annotated[int, typer.Option(min=1, help="Attention heads.")] = 2,
    backbone: Annotated[
        Path | None, typer.Option(help="A local Hugging Face causal-LM checkpoint folder to fine-tune instead.")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(min=1, max=256, help="CPU threads for torch (default: the cores it may use, at most 2)."),
    ] = None,
    device: Annotated[
        str, typer.Option(help="Where training runs: cpu, cuda, cuda:N, or auto (a GPU when torch sees one).")
    ] = "cpu",
    signing_key: Annotated[
        Path | None, typer.Option(help="ed25519 private key: export the signed int8 ONNX artifact to --out.")
    ] = None,
    version: Annotated[str | None, typer.Option(help="Artifact version (default: a UTC timestamp).")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any other training setting, as NAME=VALUE (repeatable): dropout=0.2, learning_rate=1e-3, "
            "token_dropout=0.2, ordinal_init=false, bins=8 ... (the fields of "
            "models.training.train.TrainSettings and of its tokenizer). Lists and mappings in JSON: "
            "'search=[{\"n_embd\": 64}]' trains a variant too and keeps the better on validation (by default, "
            "block slopes where the sequences are short; search=[] for none).",
        ),
    ] = None,
    quiet: QuietOption = False,
    progress: ProgressOption = False,
) -> None:
    """Train the telemetry language model; choose its steps and alert threshold on validation data it does not learn
    from (a period at the end, or a share of the machines), then refit on everything."""
    from pydantic import ValidationError

    from models.edge.tokenizer import TokenizerError
    from models.training.dataset import DatasetError, MachineSplit
    from models.training.train import TrainSettings, available_threads, describe, train
    from precursor.contracts.messages import ContractError

    horizon_h = _hours(horizon, "--horizon")
    if scaling is None:  # the split says it: machines held out for test are machines the model never saw
        scaling = "fleet" if test_machines is not None else "machine"
    if scaling not in ("machine", "fleet"):
        raise typer.BadParameter(f"scaling={scaling!r}: choose machine or fleet", param_hint="--scaling")
    if validation is None:  # the same for validation: new machines, as the test will have
        validation = "machines" if test_machines is not None else "time"
    if validation not in ("time", "machines"):
        raise typer.BadParameter(f"validation={validation!r}: choose time or machines", param_hint="--validation")
    try:
        given: dict[str, object] = dict(
            horizon_h=horizon_h,
            window_h=_hours(window, "--window") if window is not None else horizon_h,
            every_h=_hours(every, "--every"),
            scaling=scaling,
            daily_profile=daily_profile,
            max_length=max_length,
            seed=seed,
            members=members,
            max_minutes=max_minutes,
            max_steps=max_steps,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            backbone=backbone,
            threads=threads if threads is not None else available_threads(),
            device=device,
        )
        # Named only when given: TrainSettings' defaults, which training may shorten for a fleet of many sensors.
        if blocks is not None:
            given["blocks"] = blocks
        if block_stats is not None:
            given["block_stats"] = _stats(block_stats, "--block-stats")
        if window_stats is not None:
            given["window_stats"] = _stats(window_stats, "--window-stats")
        settings = TrainSettings(**{**given, **_settings_overrides(set_ or [])})
    except ValidationError as err:
        raise fail(f"invalid training settings: {err}", 1) from None
    try:
        with _progress(quiet, progress) as shown:
            result = train(
                telemetry,
                events,
                out,
                settings,
                machines=machines,
                until=until,
                signing_key=signing_key,
                version=version,
                progress=shown,
                test_machines=MachineSplit.parse(test_machines) if test_machines is not None else None,
                validation=validation,
            )
    except (DatasetError, TokenizerError, ContractError, FileNotFoundError, ValueError) as err:
        raise fail(str(err), 1) from None
    typer.echo(describe(result.meta))
    if result.artifact_dir is not None:
        typer.echo(f"signed artifact: {result.artifact_dir}  (checkpoint: {result.checkpoint_dir})")
    else:
        typer.echo(f"checkpoint: {result.checkpoint_dir}")


def evaluate_command(
    model: Annotated[Path, typer.Option(help="A checkpoint folder from `precursor train`, or a signed artifact.")],
    telemetry: Annotated[Path, typer.Option(help="Test telemetry file.")],
    events: Annotated[Path, typer.Option(help="Test events file (the failures to find).")],
    machines: Annotated[Path | None, typer.Option(help="Machines file.")] = None,
    horizon: Annotated[str | None, typer.Option(help="Must match the model's horizon (default: the model's).")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Test windows end at or after this time (default: the end of the model's training data)."),
    ] = None,
    test_machines: Annotated[
        str | None,
        typer.Option(
            help="Test only these machines, left out of the baselines' training: a fraction or a file of machine ids "
            "(default: those the model held out with `precursor train --test-machines`)."
        ),
    ] = None,
    trusted_keys: Annotated[
        Path | None, typer.Option(help="Public key file or folder that may sign the artifact (for signed artifacts).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    diagram: Annotated[
        Path | None, typer.Option(help="Also write the reliability diagram (SVG) of the model and baselines here.")
    ] = None,
    quiet: QuietOption = False,
    progress: ProgressOption = False,
) -> None:
    """Evaluate the model and two baselines on the same test windows, each at its validation-chosen threshold."""
    from models.edge.tokenizer import TokenizerError
    from models.training.dataset import DatasetError, MachineSplit
    from models.training.evaluate import evaluate
    from precursor.contracts.messages import ContractError

    horizon_h = _hours(horizon, "--horizon") if horizon is not None else None
    try:
        with _progress(quiet, progress) as shown:
            report = evaluate(
                model,
                telemetry,
                events,
                machines,
                horizon_h=horizon_h,
                since=since,
                trusted_keys=trusted_keys,
                progress=shown,
                test_machines=MachineSplit.parse(test_machines) if test_machines is not None else None,
            )
    except (DatasetError, TokenizerError, ContractError, FileNotFoundError, ValueError) as err:
        raise fail(str(err), 1) from None
    typer.echo(report.to_json() if json_output else report.table())
    if diagram is not None:
        report.write_reliability_diagram(diagram)
