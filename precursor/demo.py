"""``precursor demo``: the whole spine on one machine, with real parts, from a cold start.

    simulated history -> the telemetry LM trained, exported to int8 ONNX and signed (the cloud's part)
    simulated fleet (two sites) -> two edge agent daemons running that LM -> Kafka (local KRaft broker)
    -> Beam pipeline -> DuckDB -> the machines most at risk

The LM is small and trained for a fixed number of steps (a minute or two on two cores), so the demo shows the path,
not the best model: ``precursor train`` with its defaults is how a real one is made. ``--model drift-zscore`` runs the
statistical baseline instead and skips training.

Each run uses topics of its own (prefix ``demo<time>``) and deletes the previous run's, so a second run starts from a
clean slate while reusing the installed environment, the resolved jars and the running broker.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import typer
import yaml
from transformers.utils import logging as transformers_logging

from edge_agent.identity import enroll
from infra.kafka_admin import admin_client, ensure_topics
from infra.kafka_broker import LocalKafka
from models.edge.signing import generate_keypair
from models.training.train import TrainSettings, train
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from precursor.contracts.settings import PrecursorSettings
from precursor.output import show
from precursor.simulator import FleetConfig, FleetFiles, write_fleet
from precursor.store.queries import at_risk, counts_per_edge

SITES = ("plant-a", "plant-b")


STEPS = 6
HISTORY_DAYS = 21.0
HISTORY = timedelta(days=HISTORY_DAYS)
WINDOW_H, EVERY_H, HORIZON_H = 6.0, 1.0, 24.0
DEMO_TRAINING = TrainSettings(
    horizon_h=HORIZON_H,
    window_h=WINDOW_H,
    every_h=EVERY_H,
    min_points=12,
    # The history is another stretch of simulated time (another seed), so each machine's own scaling would not carry
    # over: scale by the fleet's figures.
    scaling="fleet",
    max_steps=250,
    eval_every=50,
    max_minutes=10.0,  # the step count, not the clock, ends training: the same model on a busy machine
    threads=1,
)


def _step(n: int, text: str) -> float:
    typer.secho(f"\n[{n}/{STEPS}] {text}", bold=True)
    return time.monotonic()


def _done(started: float, text: str) -> None:
    typer.echo(f"      {text} ({time.monotonic() - started:.1f} s)")


def run_demo(*, machines: int = 40, days: float = 14.0, seed: int = 7, model: str = "lm") -> None:
    settings = PrecursorSettings()
    home = settings.state_dir / "demo"
    began = time.monotonic()

    t = _step(1, "Kafka: the local broker (KRaft, jars from Maven Central, no Docker)")
    broker = LocalKafka(state_dir=settings.state_dir)
    broker.up(report=lambda line: typer.echo(f"      {line}"))
    prefix = f"demo{int(time.time())}"
    kafka = broker.kafka_settings(topic_prefix=prefix)
    _forget_previous_run(home, broker)
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / "run.json").write_text(json.dumps({"topic_prefix": prefix}))
    ensure_topics(kafka, kafka.topics.specs())
    _done(t, f"topics {prefix}.* ready at {kafka.bootstrap_servers}")

    t = _step(2, f"Simulating {machines} machines over {days:g} days at two sites, and {HISTORY_DAYS:g} days before")
    configs = []
    history = []
    live_start = FleetConfig(machines=1, duration="1d").start
    for i, site in enumerate(SITES):
        count = machines // len(SITES) + (i < machines % len(SITES))
        config = FleetConfig(
            machines=count, duration=f"{days}d", interval="10m", seed=seed + i, machine_prefix=site, start=live_start
        )
        files = write_fleet(config, home / "fleet" / site)
        s = files.summary
        typer.echo(f"      {site}: {s.rows:,} readings, failures {s.failures_by_kind} -> {files.telemetry.parent}")
        configs.append((site, files))
        past = FleetConfig(
            machines=count,
            duration=f"{HISTORY_DAYS}d",
            interval="10m",
            seed=seed + 100 + i,
            machine_prefix=site,
            start=live_start - HISTORY,
        )
        history.append(write_fleet(past, home / "history" / site))
    _done(t, "fleet written in the generic formats (telemetry, events, machines)")

    t = _step(3, "Cloud: train the telemetry LM on the history, export int8 ONNX, sign it")
    if model == "lm":
        model_spec = _train_signed_lm(home, history)
        _done(t, f"signed artifact {model_spec['artifact']}")
    else:
        model_spec = {"type": "drift-zscore", "horizon": f"{HORIZON_H:g}h"}
        _done(t, f"skipped: the edge agents run the {model} baseline")

    t = _step(4, "Edge agents: one daemon per site, scoring every window and publishing with acks=all")
    processes = []
    enrolled = []
    for site, files in configs:
        # Each edge gets its own key, enrolled with the pipeline, so its heartbeats arrive verified.
        enrolled.append(enroll(home / "edge-state" / site, f"edge-{site}").line)
        config_path = home / f"edge-{site}.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "edge_id": f"edge-{site}",
                    "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "topic_prefix": prefix},
                    "sources": [
                        {
                            "type": "replay",
                            "telemetry": str(files.telemetry.resolve()),
                            "events": str(files.events.resolve()),
                            "machines": str(files.machines.resolve()),
                        }
                    ],
                    "window": {"length": f"{WINDOW_H:g}h", "every": f"{EVERY_H:g}h", "min_points": 12},
                    "model": model_spec,
                    "health": {"port": 0},
                    # Sensor lines for the machine pages: a summary per machine per window period.
                    "telemetry_summaries": {"enabled": True},
                    "state_dir": str((home / "edge-state" / site).resolve()),
                }
            )
        )
        command = [sys.executable, "-m", "precursor", "edge", "run", "--config", str(config_path)]
        processes.append((site, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for site, process in processes:
        output, _ = process.communicate()
        if process.returncode != 0:
            typer.echo(output, err=True)
            raise typer.Exit(f"edge agent for {site} failed (exit {process.returncode})")  # type: ignore[arg-type]
        typer.echo(f"      {site}: {output.strip().splitlines()[-1]}")
    _done(t, "both edge agents drained and flushed")

    t = _step(5, "Beam pipeline (FnApiRunner, in-process): validate, dead-letter, drop duplicates, store")
    store = home / "predictions.duckdb"
    enrolled_edges = home / "enrolled-edges"
    enrolled_edges.write_text("".join(line + "\n" for line in enrolled))
    report = run_once(kafka, store, pipeline_settings=PipelineSettings(enrolled_edges=enrolled_edges))
    typer.echo(
        f"      read {report.read:,}, stored {report.stored:,}, duplicates dropped {report.duplicates}, "
        f"dead-lettered {report.dead_lettered} -> {store}"
    )
    typer.echo(
        f"      telemetry summaries: read {report.telemetry_read:,}, stored as "
        f"{report.telemetry_rows_stored:,} sensor rows (the machine pages' sensor lines)"
    )
    _done(t, "pipeline run complete")

    t = _step(6, "Query: the machines most at risk now")
    show(counts_per_edge(store), title="Predictions per edge")
    columns = ("machine_id", "max_risk", "top_kind", "window_end", "elevated_since", "model_name", "edge_id")
    rows = [
        {c: row.get(c) for c in columns} | {"open_alerts": len(row.get("open_alerts") or [])}
        for row in at_risk(store, limit=10)
    ]
    show(rows, title="Machines most at risk")
    _done(t, f"try: precursor query at-risk --store {store}")
    typer.secho(f"\nDemo finished in {time.monotonic() - began:.0f} s.", bold=True)
    # The broker stays up on purpose: the next demo run and the queries above reuse it.
    typer.echo(f"The local Kafka broker keeps running at {kafka.bootstrap_servers}; `precursor kafka down` stops it.")


def _train_signed_lm(home: Path, history: list[FleetFiles]) -> dict[str, object]:
    """Train on both sites' history (one fleet), export and sign; returns the edge config's model section."""
    data = home / "history" / "fleet"
    data.mkdir(parents=True)
    for name in ("telemetry", "events", "machines"):
        _concatenate_csv([getattr(files, name) for files in history], data / f"{name}.csv")
    keys = generate_keypair(home / "keys", "demo")
    typer.echo(f"      training {DEMO_TRAINING.max_steps} steps on one core (a minute or two; more on a busy machine)")
    # The step-by-step training log and the libraries' progress bars would bury the demo's own lines.
    transformers_logging.disable_progress_bar()
    logging.disable(logging.WARNING)
    try:
        result = train(
            data / "telemetry.csv",
            data / "events.csv",
            home / "model",
            DEMO_TRAINING,
            machines=data / "machines.csv",
            signing_key=keys.private_key_path,
            checkpoint_dir=home / "checkpoint",
            version="demo-1",
        )
    finally:
        logging.disable(logging.NOTSET)
    meta = result.meta
    refit = meta.training.get("refit")
    refit_steps = f", refit {'/'.join(map(str, refit['steps']))} steps on all" if isinstance(refit, dict) else ""
    typer.echo(
        f"      {meta.parameters:,} parameters, best at step {meta.step} of {DEMO_TRAINING.max_steps}{refit_steps}, "
        f"{result.seconds:.0f} s; validation PR-AUC {meta.validation.get('pr_auc', float('nan')):.3f}, "
        f"alert threshold {meta.threshold:.3f}"
    )
    assert result.artifact_dir is not None
    return {
        "type": "lm",
        "artifact": str(result.artifact_dir.resolve()),
        "trusted_keys": [str(keys.public_key_path.resolve())],
    }


def _concatenate_csv(parts: list[Path], out: Path) -> None:
    """One CSV of several with the same header (each site's files), for training on the whole fleet."""
    with out.open("w") as sink:
        for i, part in enumerate(parts):
            with part.open() as source:
                header = source.readline()
                if i == 0:
                    sink.write(header)
                shutil.copyfileobj(source, sink)


def _forget_previous_run(home: Path, broker: LocalKafka) -> None:
    """Delete the topics of the previous demo run, so runs don't pile up partitions on the local broker."""
    try:
        previous = json.loads((home / "run.json").read_text())["topic_prefix"]
    except (OSError, ValueError, KeyError):
        return
    settings = broker.kafka_settings(topic_prefix=previous)
    with admin_client(settings, timeout_s=10) as admin:
        admin.delete_topics([spec.name for spec in settings.topics.specs()], raise_errors=False)
