"""``precursor demo``: the whole spine on one machine, with real parts, from a cold start.

    simulated fleet (two sites) -> two edge agent daemons -> Kafka (local KRaft broker) -> Beam pipeline -> DuckDB
    -> the machines most at risk

Each run uses topics of its own (prefix ``demo<time>``) and deletes the previous run's, so a second run starts from a
clean slate while reusing the installed environment, the resolved jars and the running broker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import typer
import yaml

from contracts.settings import PrecursorSettings
from infra.kafka_admin import admin_client, ensure_topics
from infra.kafka_broker import LocalKafka
from pipelines.run import run_once
from precursor.output import show
from simulator import FleetConfig, write_fleet
from store.queries import at_risk, counts_per_edge

SITES = ("plant-a", "plant-b")


def _step(n: int, text: str) -> float:
    typer.secho(f"\n[{n}/5] {text}", bold=True)
    return time.monotonic()


def _done(started: float, text: str) -> None:
    typer.echo(f"      {text} ({time.monotonic() - started:.1f} s)")


def run_demo(*, machines: int = 40, days: float = 14.0, seed: int = 7) -> None:
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

    t = _step(2, f"Simulating {machines} machines over {days:g} days at two sites")
    configs = []
    for i, site in enumerate(SITES):
        config = FleetConfig(
            machines=machines // len(SITES) + (i < machines % len(SITES)),
            duration=f"{days}d",
            interval="10m",
            seed=seed + i,
            machine_prefix=site,
        )
        files = write_fleet(config, home / "fleet" / site)
        s = files.summary
        typer.echo(f"      {site}: {s.rows:,} readings, failures {s.failures_by_kind} -> {files.telemetry.parent}")
        configs.append((site, files))
    _done(t, "fleet written in the generic formats (telemetry, events, machines)")

    t = _step(3, "Edge agents: one daemon per site, scoring every window and publishing with acks=all")
    processes = []
    for site, files in configs:
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
                    "window": {"length": "6h", "every": "1h", "min_points": 12},
                    "model": {"type": "drift-zscore", "horizon": "24h"},
                    "health": {"port": 0},
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

    t = _step(4, "Beam pipeline (FnApiRunner, in-process): validate, dead-letter, drop duplicates, store")
    store = home / "predictions.duckdb"
    report = run_once(kafka, store)
    typer.echo(
        f"      read {report.read:,}, stored {report.stored:,}, duplicates dropped {report.duplicates}, "
        f"dead-lettered {report.dead_lettered} -> {store}"
    )
    _done(t, "pipeline run complete")

    t = _step(5, "Query: the machines most at risk now")
    show(counts_per_edge(store), title="Predictions per edge")
    columns = ("machine_id", "max_risk", "top_kind", "window_end", "elevated_since", "model_name", "edge_id")
    rows = [
        {c: row.get(c) for c in columns} | {"open_alerts": len(row.get("open_alerts") or [])}
        for row in at_risk(store, limit=10)
    ]
    show(rows, title="Machines most at risk")
    _done(t, f"try: precursor query at-risk --store {store}")
    typer.secho(f"\nDemo finished in {time.monotonic() - began:.0f} s.", bold=True)


def _forget_previous_run(home: Path, broker: LocalKafka) -> None:
    """Delete the topics of the previous demo run, so runs don't pile up partitions on the local broker."""
    try:
        previous = json.loads((home / "run.json").read_text())["topic_prefix"]
    except (OSError, ValueError, KeyError):
        return
    settings = broker.kafka_settings(topic_prefix=previous)
    with admin_client(settings, timeout_s=10) as admin:
        admin.delete_topics([spec.name for spec in settings.topics.specs()], raise_errors=False)
