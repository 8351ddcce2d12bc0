"""``precursor explain``: why any prediction, on demand, where the raw telemetry is.

An edge explains its alerting windows as it scores them. For any other prediction (a quiet window, one from before
explanations were on, one whose reasons someone wants again) the window has to be rebuilt from its readings, and
those stay at the edge: so the command runs there, on the edge's own config (its running model, verified as the
daemon verifies it; its window rule; its replay or tail files), or on files and a signed model given by hand. It
scores the window as the edge did, explains it whatever its risk, and with ``--store`` sets the stored prediction
for that window beside it (its risk, model version and the reasons it came with).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from precursor.common import fail

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Files:
    telemetry: Path
    events: Path | None
    machines: Path | None


def explain_command(
    machine: Annotated[str, typer.Option("--machine", "-m", help="the machine whose prediction to explain")],
    at: Annotated[
        str | None,
        typer.Option("--at", help="the window's end (ISO 8601 or epoch seconds) [default: its latest window]"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="an edge config: its running model, window rule and telemetry files"),
    ] = None,
    model: Annotated[Path | None, typer.Option("--model", help="a signed model artifact folder")] = None,
    trusted_keys: Annotated[
        list[Path] | None, typer.Option("--trusted-keys", help="public keys (.pub or folders) that may sign models")
    ] = None,
    telemetry: Annotated[Path | None, typer.Option(help="telemetry file (generic format)")] = None,
    events: Annotated[Path | None, typer.Option(help="events file")] = None,
    machines: Annotated[Path | None, typer.Option(help="machines file (static attributes)")] = None,
    window: Annotated[str, typer.Option(help="window length, without --config")] = "6h",
    every: Annotated[str, typer.Option(help="a window ends every, without --config")] = "1h",
    min_points: Annotated[int, typer.Option(help="readings a window needs, without --config")] = 3,
    store: Annotated[Path | None, typer.Option(help="a prediction store: show the stored prediction beside")] = None,
    max_reasons: Annotated[int, typer.Option(min=1, max=8)] = 5,
    min_log_odds_drop: Annotated[float, typer.Option(min=0.0, help="the smallest fall in log-odds that counts")] = 0.1,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Why a prediction: rebuild one machine's window from the telemetry where it lies, score it with the signed
    model the edge runs and explain it by occlusion, whatever its risk."""
    from edge_agent.config import ConfigError, EdgeConfig, ModelSpec
    from models.edge.explain import ExplainSettings, explainer_for
    from models.training.dataset import DatasetError, Fleet, WindowSpec, build_windows
    from precursor.contracts.durations import parse_duration

    if (config is None) == (model is None):
        raise fail("give either --config (an edge's) or --model with --trusted-keys")
    try:
        if config is not None:
            edge = EdgeConfig.load(config)
            spec, scorer = edge.model, _running(edge)
            files = _files(edge, telemetry, events, machines)
            length, step, points = edge.window.length, edge.window.every, edge.window.min_points
            lookback_h = edge.window.event_lookback.total_seconds() / 3600
        else:
            if not trusted_keys:
                raise fail("--model needs --trusted-keys: a model is verified before it is loaded")
            if telemetry is None:
                raise fail("--model needs --telemetry: the readings the window is rebuilt from")
            spec = ModelSpec(type="lm", artifact=model, trusted_keys=trusted_keys)
            scorer = _load(spec)
            files = Files(telemetry, events, machines)
            length, step, points = parse_duration(window), parse_duration(every), min_points
            lookback_h = 30 * 24.0
    except (ConfigError, ValueError) as err:
        raise fail(err) from None
    if not hasattr(scorer, "score_token_ids"):
        raise fail(f"the model {scorer.name} {scorer.version} is a baseline: it has no explanation")
    try:
        fleet = Fleet.load(files.telemetry, files.events, files.machines)
        end_s = _window_end(fleet, machine, at, step.total_seconds())
        windows = build_windows(
            fleet,
            WindowSpec(
                window_h=length.total_seconds() / 3600,
                horizon_h=scorer.horizon_h,
                every_h=step.total_seconds() / 3600,
                min_points=points,
                event_lookback_h=lookback_h,
            ),
            ends_from_s=end_s,
            ends_before_s=end_s + 1,
            labels_until_s=end_s + math.ceil(scorer.horizon_h * 3600),
            machines=[machine],
        )
    except (DatasetError, ValueError, FileNotFoundError) as err:
        raise fail(err) from None
    if not windows:
        raise fail(
            f"no window of {machine} ends at {_iso(end_s)}: windows end every {step} and need {points} readings "
            f"within {length} before their end in {files.telemetry}"
        )
    found = windows[0].window
    risk = scorer.score(found)
    explainer = explainer_for(scorer, ExplainSettings(max_reasons=max_reasons, min_log_odds_drop=min_log_odds_drop))
    if explainer is None:
        raise fail(f"the model {scorer.name} {scorer.version} cannot be explained (its tokenizer is not ours)")
    reasons = explainer.explain_many([found], [risk])[0]
    threshold = getattr(scorer, "threshold", None)
    answer: dict[str, Any] = {
        "machine_id": machine,
        "window_start": found.start.isoformat(),
        "window_end": found.end.isoformat(),
        "model_name": scorer.name,
        "model_version": scorer.version,
        "risk": risk,
        "threshold": threshold,
        "reasons": [r.model_dump(mode="json", exclude_none=True) for r in reasons],
        "stored": _stored(store, machine, found.end) if store is not None else None,
    }
    if as_json:
        typer.echo(json.dumps(answer, indent=1))
        return
    _print(answer)


def _load(spec: Any) -> Any:
    from edge_agent.scorers import load_configured

    try:
        return load_configured(spec).scorer
    except Exception as err:  # a bad signature, a missing file, an ONNX error: say which and stop
        raise fail(f"cannot load the model {spec.artifact}: {err}") from None


def _running(edge: Any) -> Any:
    """The model the edge runs now: an update it took (verified again), else the one its config names."""
    from edge_agent.scorers import load_running

    try:
        running, _ = load_running(edge.model, edge.state_dir / "models" / "current.json")
    except Exception as err:  # as the daemon: a bad artifact or key file is named, not a traceback
        raise fail(f"cannot load the edge's model {edge.model.artifact or edge.model.type}: {err}") from None
    return running.scorer


def _files(edge: Any, telemetry: Path | None, events: Path | None, machines: Path | None) -> Files:
    """Files given by hand win; else the first replay or tail source's."""
    from edge_agent.config import ReplaySource, TailSource

    for source in edge.sources:
        if isinstance(source, ReplaySource):
            return Files(telemetry or source.telemetry, events or source.events, machines or source.machines)
        if isinstance(source, TailSource):
            return Files(telemetry or source.path, events, machines or source.machines)
    if telemetry is None:
        raise fail("the edge reads no telemetry file (MQTT or the simulator): give --telemetry")
    return Files(telemetry, events, machines)


def _window_end(fleet: Any, machine: str, at: str | None, every_s: float) -> int:
    from models.training.dataset import parse_time

    rows = dict(fleet.table.machines()).get(machine)
    if rows is None:
        raise ValueError(f"no readings of machine {machine!r} in the telemetry")
    if at is not None:
        end = parse_time(at)
        if end % round(every_s):
            raise ValueError(f"--at {at}: windows end on multiples of {every_s:g} s since the epoch")
        return end
    last = int(fleet.table.timestamps[rows][-1])
    step = round(every_s)
    return (last // step) * step + step  # the window the newest reading completes


def _stored(path: Path, machine: str, end: datetime) -> list[dict[str, Any]]:
    from precursor.store.queries import reading

    try:
        with reading(path) as store:
            rows = store.machine_history(machine, since=end, until=end).rows
    except FileNotFoundError as err:
        raise fail(err) from None
    return [
        {k: row[k] for k in ("edge_id", "seq", "max_risk", "top_kind", "model_name", "model_version", "reasons")}
        for row in rows
    ]


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _print(answer: dict[str, Any]) -> None:
    risk = answer["risk"]
    top = max(risk, key=lambda k: risk[k])
    threshold = answer["threshold"]
    judged = "" if threshold is None else f" ({'at or above' if risk[top] >= threshold else 'below'} {threshold:.3f})"
    typer.echo(
        f"{answer['machine_id']}, window {answer['window_start']} .. {answer['window_end']}, "
        f"{answer['model_name']} {answer['model_version']}: risk {risk[top]:.3f} {top}{judged}"
    )
    if not answer["reasons"]:
        typer.echo("  nothing in the window moved the risk by itself")
    for i, reason in enumerate(answer["reasons"], start=1):
        typer.echo(f"  {i}. {reason['text']}  (risk {-reason['risk_drop']:+.3f} without it)")
    for row in answer["stored"] or []:
        said = "; ".join(r["text"] for r in row["reasons"]) if row["reasons"] else "no reasons"
        typer.echo(
            f"stored: {row['edge_id']} #{row['seq']} {row['model_name']} {row['model_version']}: "
            f"risk {row['max_risk']:.3f} {row['top_kind']}; {said}"
        )
    if answer["stored"] == []:
        typer.echo("stored: no prediction of this window in the store")
