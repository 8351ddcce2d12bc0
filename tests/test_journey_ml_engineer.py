"""The ML engineer's journey, as the README tells it, every step a `precursor` command in a subprocess: a fleet
(`precursor simulate`) is scored at the edge (`precursor edge run --config`) and ingested (`precursor pipeline run`);
`precursor pipeline label` turns predictions and the failures reported later into examples; `precursor keys` makes
the signing pair; `precursor flows run retrain`, configured only by `PRECURSOR_RETRAIN_*` variables (one nested
training field among them), trains a candidate against a real Prefect server, promotes it and releases it; and the
running edge verifies and swaps to the promoted model, as its heartbeat shows.

What overlaps with tests/test_closed_loop_integration.py (drift, a second retrain) is not repeated; scheduling by
`flows serve` is tests/test_flows_serve.py's. Training is a few dozen steps: the commands are under test here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kafka import KafkaConsumer

from flows.retrain import COMPARISON_ARTIFACT_KEY
from infra.prefect_server import LocalPrefectServer
from models.edge.registry import ModelRegistry
from models.edge.signing import load_public_keys
from pipelines.labeling import read_dataset
from precursor.contracts.messages import Heartbeat, decode
from precursor.contracts.settings import KafkaSettings

pytest_plugins = ["tests.fixtures_prefect"]
pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]
PRECURSOR = str(REPO_ROOT / ".venv" / "bin" / "precursor")
WINDOW_H, EVERY_H, HORIZON_H = 12, 3, 24


def precursor(*args: str | Path, env: dict[str, str], timeout_s: float = 120) -> str:
    done = subprocess.run(
        [PRECURSOR, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=env["HOME"]
    )
    assert done.returncode == 0, f"precursor {' '.join(map(str, args))}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def wait_for_line(log: Path, text: str, edge: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert edge.poll() is None, f"the edge exited with {edge.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in the edge's log within {timeout_s} s"
        time.sleep(0.2)


def flow_runs_of(flow_name: str) -> list[tuple[str, str]]:
    """(state, flow run id) of every run of ``flow_name`` that was started by hand (no deployment's schedule made it:
    a served deployment of the session keeps scheduling runs, and their pages would crowd these out)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterDeploymentId,
    )

    async def read() -> list[tuple[str, str]]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(is_null_=True)),
            )
            return [(r.state_type.value if r.state_type else "", str(r.id)) for r in runs]

    return asyncio.run(read())


def comparison_artifacts() -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read() -> list[str]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[COMPARISON_ARTIFACT_KEY]))
            )
            return [str(a.data) for a in found]

    return asyncio.run(read())


def test_an_ml_engineer_labels_retrains_from_the_environment_promotes_and_the_edge_takes_the_model(
    kafka_settings: KafkaSettings, prefect_server: LocalPrefectServer, tmp_path: Path
) -> None:
    env = {
        "PATH": f"{REPO_ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PRECURSOR_STATE_DIR": str(tmp_path / "state"),
        "PRECURSOR_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "PRECURSOR_KAFKA_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "PREFECT_API_URL": prefect_server.api_url,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(tmp_path / "prefect-home")),
        **{k: v for k, v in os.environ.items() if k.startswith("PREFECT_SERVER_") or k == "DO_NOT_TRACK"},
    }
    fleet, store, labeled = tmp_path / "fleet", tmp_path / "store.duckdb", tmp_path / "labeled"
    precursor("simulate", "--out", fleet, "--machines", 8, "--days", 24, "--interval", "30m", "--seed", 5,
              "--mtbf-days", 3, env=env)  # fmt: skip
    precursor("keys", tmp_path / "keys", env=env)

    # An edge on the fleet's files, scoring with the z-score baseline until a model is released, and staying up.
    config = {
        "edge_id": "edge-ml-1",
        "kafka": {"bootstrap_servers": kafka_settings.bootstrap_servers, "topic_prefix": kafka_settings.topic_prefix},
        "sources": [
            {
                "type": "replay",
                "telemetry": str(fleet / "telemetry.csv"),
                "events": str(fleet / "events.csv"),
                "machines": str(fleet / "machines.csv"),
            }
        ],
        "window": {"length": f"{WINDOW_H}h", "every": f"{EVERY_H}h", "min_points": 3, "event_lookback": "72h"},
        "model": {"type": "drift-zscore", "horizon": f"{HORIZON_H}h", "trusted_keys": [str(tmp_path / "keys")]},
        "updates": {"enabled": True, "poll": "0.2s"},
        "heartbeat": {"interval": "1s"},
        "health": {"port": 0},
        "log": {"format": "text", "level": "INFO"},
        "exit_when_sources_end": False,
        "state_dir": str(tmp_path / "edge-state"),
    }
    (tmp_path / "edge.yaml").write_text(yaml.safe_dump(config))
    heartbeats = KafkaConsumer(
        kafka_settings.topics.heartbeats, **kafka_settings.client_kwargs(), auto_offset_reset="earliest"
    )
    log = tmp_path / "edge.log"
    with log.open("w") as out:
        edge = subprocess.Popen(
            [PRECURSOR, "edge", "run", "--config", tmp_path / "edge.yaml"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=out,
        )
    try:
        wait_for_line(log, "telemetry.csv ended", edge, 60)
        seen: list[Heartbeat] = []
        deadline = time.monotonic() + 20
        while not (seen and seen[-1].outbox_depth == 0 and seen[-1].timestamp.timestamp() > time.time() - 1):
            assert time.monotonic() < deadline, f"the outbox did not drain: {seen[-1:]}"
            seen += [decode(Heartbeat, r.value) for rs in heartbeats.poll(timeout_ms=300).values() for r in rs]
        assert seen[-1].model_name == "drift-zscore"

        precursor("pipeline", "run", "--store", store, env=env)
        precursor("pipeline", "label", "--store", store, "--dataset", labeled, env=env)
        examples = read_dataset(labeled).to_pylist()
        failures = {(r["machine_id"], r["failure_at"]) for r in examples if r["outcome"] != "ok"}
        assert len(examples) > 100 and len(failures) >= 5, (len(examples), len(failures))

        retrain_env = env | {
            "PRECURSOR_RETRAIN_LABELED_DATASET": str(labeled),
            "PRECURSOR_RETRAIN_TELEMETRY": str(fleet / "telemetry.csv"),
            "PRECURSOR_RETRAIN_EVENTS": str(fleet / "events.csv"),
            "PRECURSOR_RETRAIN_MACHINES": str(fleet / "machines.csv"),
            "PRECURSOR_RETRAIN_REGISTRY": str(tmp_path / "registry"),
            "PRECURSOR_RETRAIN_SIGNING_KEY": str(tmp_path / "keys" / "precursor.key"),
            "PRECURSOR_RETRAIN_TRUSTED_KEYS": str(tmp_path / "keys"),
            "PRECURSOR_RETRAIN_HORIZON_H": str(HORIZON_H),
            "PRECURSOR_RETRAIN_HOLDOUT_H": str(6 * 24),
            "PRECURSOR_RETRAIN_PROMOTION_MARGIN": "0.0",
            "PRECURSOR_RETRAIN_TRAINING": (
                f'{{"horizon_h": {HORIZON_H}, "window_h": {WINDOW_H}, "every_h": {EVERY_H}, "blocks": 2, "bins": 8,'
                ' "max_length": 64, "n_layer": 1, "n_embd": 32, "n_head": 2, "batch_size": 32, "warmup_steps": 2,'
                ' "eval_every": 20, "validation_fraction": 0.15, "min_validation_failures": 1}'
            ),
            "PRECURSOR_RETRAIN_TRAINING__MAX_STEPS": "80",
        }
        runs_before = {run for _, run in flow_runs_of("retrain")}  # other tests of the session share the server
        output = precursor("flows", "run", "retrain", env=retrain_env, timeout_s=240)
        assert output.startswith("promoted: candidate "), output
        version = output.split()[2]
        assert f"champion: {version}" in output

        registry = ModelRegistry(tmp_path / "registry", load_public_keys(tmp_path / "keys"))
        champion = registry.champion()
        assert champion is not None and champion.version == version
        trained = json.loads((champion.path / "precursor.json").read_text())["training"]
        # The nested variable and the JSON section merge into the one training settings the model was trained with.
        assert (trained["max_steps"], trained["n_embd"], trained["tokenizer"]["window_h"]) == (80, 32, WINDOW_H)
        assert trained["history"][-1]["step"] == 80
        runs = [(state, run) for state, run in flow_runs_of("retrain") if run not in runs_before]
        assert [state for state, _ in runs] == ["COMPLETED"], runs
        assert any(version in table for table in comparison_artifacts())

        # The release went out on model-updates; the edge verified it, self-tested it and runs it now.
        deadline = time.monotonic() + 30
        while not (seen and seen[-1].model_version == version):
            assert time.monotonic() < deadline, f"the edge never ran {version}: {log.read_text()[-3000:]}"
            seen += [decode(Heartbeat, r.value) for rs in heartbeats.poll(timeout_ms=300).values() for r in rs]
        assert seen[-1].model_name != "drift-zscore" and seen[-1].health == "ok"
    finally:
        edge.send_signal(signal.SIGTERM)
        code = edge.wait(30)
        heartbeats.close()
    assert code == 0, log.read_text()[-3000:]
