"""The operator's journey, as the README tells it: install the edge runtime alone (`pip install 'precursor[edge]'`, no
torch), create the release keys (`precursor keys`), write a YAML config with an MQTT source and the signed language
model, run `precursor edge run --config`, and watch readings published over MQTT come out as predictions on Kafka;
then a signed update arrives on model-updates, is verified and swapped in, and the heartbeat shows the new version.

Every command runs as its console script in a subprocess; the edge runs from its own fresh virtual environment. The
broker is the session's real Kafka, the MQTT broker a real mosquitto.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer

from models.edge.registry import release_for
from models.edge.releases import ReleaseSigner
from models.edge.signing import load_private_key
from precursor.contracts.messages import Heartbeat, Prediction, decode, encode
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_edge import Mosquitto, build_artifact, publisher, resign

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]
CLOUD_BIN = REPO_ROOT / ".venv" / "bin"
SENSORS = ("pressure", "temp", "vib")
MACHINES = ("pump-1", "pump-2", "compressor-1")
T0 = 1_767_225_600


def wheelhouse() -> Path:
    """Wheels of the edge extra's dependencies, downloaded once per state folder so later runs install offline."""
    state_dir = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    return state_dir / "wheelhouse" / "edge"


def pip(*args: str | Path, python: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(CLOUD_BIN / "pip"), *(["--python", str(python)] if python else []), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `precursor[edge]` installed from this checkout's wheel, as an operator's box would have.

    Bytecode compilation is skipped (`--no-compile`): it is most of pip's time and the interpreter compiles on import.
    """
    root = tmp_path_factory.mktemp("edge-install")
    # Built from a copy of the sources: setuptools' build folder in the checkout would keep modules deleted since.
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    packages = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for package in (name.rstrip("*") for name in packages["include"]):
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root / "dist", source)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((root / "dist").glob("precursor-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    offline = ("install", "-q", "--no-compile", "--no-index", "--find-links", wheelhouse(), f"{wheel}[edge]")
    done = pip(*offline, python=python)
    if done.returncode != 0:  # first run on this machine: fetch the wheels, then install offline as always
        fetched = pip("download", "-q", "-d", wheelhouse(), f"{wheel}[edge]")
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        for stale in wheelhouse().glob("precursor-*.whl"):
            stale.unlink()
        done = pip(*offline, python=python)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


def publish_readings(broker: Mosquitto, topic: str, minutes: range) -> None:
    """One reading every 10 s per machine over ``minutes`` of event time, QoS 1, as a plant gateway would send."""
    client = publisher(broker.port, client_id=f"plant-gw-{time.monotonic_ns()}")
    for step in range(minutes.start * 6, minutes.stop * 6):
        for n, machine in enumerate(MACHINES):
            reading = {"timestamp": T0 + 10 * step, "machine_id": machine}
            reading |= {s: 50.0 + k * 10 + n + (step % 7) * 0.3 for k, s in enumerate(SENSORS)}
            client.publish(f"{topic}/{machine}", json.dumps(reading), qos=1).wait_for_publish(5)
    client.loop_stop()
    client.disconnect()


class Topic:
    """A consumer of one topic from its start; ``until`` collects decoded messages until a condition holds."""

    def __init__(self, settings: KafkaSettings, topic: str, kind: type) -> None:
        self.kind = kind
        self.seen: list = []  # type: ignore[type-arg]
        self.consumer = KafkaConsumer(topic, **settings.client_kwargs(), auto_offset_reset="earliest")

    def until(self, condition, timeout_s: float, what: str, edge: subprocess.Popen[str]) -> list:  # type: ignore[no-untyped-def,type-arg]
        deadline = time.monotonic() + timeout_s
        while not condition(self.seen):
            assert edge.poll() is None, f"the edge exited with {edge.returncode} while waiting for {what}"
            assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
            for records in self.consumer.poll(timeout_ms=200).values():
                self.seen += [decode(self.kind, r.value) for r in records]
        return self.seen


def test_an_operator_installs_the_edge_alone_runs_it_on_mqtt_and_takes_a_signed_update(
    edge_venv: Path, mosquitto: Mosquitto, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    edge_bin = edge_venv / "bin"
    no_torch = subprocess.run([edge_bin / "python", "-c", "import torch"], capture_output=True, text=True, cwd=tmp_path)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    installed = {p.name.lower() for p in next((edge_venv / "lib").glob("python*/site-packages")).iterdir()}
    cloud_only = {"torch", "transformers", "onnx", "sklearn", "apache_beam", "prefect", "duckdb", "fastapi"}
    assert installed & cloud_only == set()
    assert {"onnxruntime", "tokenizers", "paho", "cryptography"} <= installed

    # The cloud side: the release keys, and the signed model the operator is handed.
    keys = subprocess.run(
        [CLOUD_BIN / "precursor", "keys", tmp_path / "keys", "--name", "release"], capture_output=True, text=True
    )
    assert keys.returncode == 0, keys.stderr
    signing_key, public_key = tmp_path / "keys" / "release.key", tmp_path / "keys" / "release.pub"
    assert signing_key.stat().st_mode & 0o777 == 0o600
    v1 = build_artifact(tmp_path / "models", "0.1.0", signing_key, SENSORS)
    v2 = resign(v1, tmp_path / "models" / "artifact-0.2.0", "0.2.0", signing_key)

    config = {
        "edge_id": "plant-7-gw-1",
        "kafka": {"bootstrap_servers": kafka_settings.bootstrap_servers, "topic_prefix": kafka_settings.topic_prefix},
        "sources": [{"type": "mqtt", "host": "127.0.0.1", "port": mosquitto.port, "topics": ["plant7/telemetry/#"]}],
        "window": {"length": "2m", "every": "1m", "min_points": 3},
        "model": {"type": "lm", "artifact": str(v1), "trusted_keys": [str(public_key)]},
        "updates": {"enabled": True, "targets": ["fleet"], "poll": "0.2s"},
        "heartbeat": {"interval": "1s"},
        "health": {"port": 0},
        "exit_when_sources_end": False,
        "drain_timeout": "5s",
        "state_dir": str(tmp_path / "edge-state"),
    }
    config_file = tmp_path / "edge.yaml"
    config_file.write_text(yaml.safe_dump(config))
    predictions = Topic(kafka_settings, kafka_settings.topics.predictions, Prediction)
    heartbeats = Topic(kafka_settings, kafka_settings.topics.heartbeats, Heartbeat)

    log = (tmp_path / "edge.log").open("w")
    edge = subprocess.Popen(
        [edge_bin / "precursor", "edge", "run", "--config", config_file],
        cwd=tmp_path,
        env={"PATH": f"{edge_bin}:/usr/bin:/bin", "HOME": str(tmp_path)},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        heartbeats.until(lambda seen: seen, 30, "first heartbeat", edge)
        assert heartbeats.seen[0].model_version == "0.1.0" and heartbeats.seen[0].edge_id == "plant-7-gw-1"
        time.sleep(0.5)  # the MQTT subscription settles after the agent is up
        publish_readings(mosquitto, "plant7/telemetry", range(0, 6))
        first = predictions.until(lambda seen: {p.machine_id for p in seen} == set(MACHINES), 30, "predictions", edge)
        assert {p.model_version for p in first} == {"0.1.0"}
        assert all(0.0 <= r <= 1.0 for p in first for r in p.risk.values())

        release = ReleaseSigner(load_private_key(signing_key))(release_for(v2, target="fleet"))
        producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
        producer.send(kafka_settings.topics.model_updates, key=b"fleet", value=encode(release)).get(timeout=30)
        producer.close()
        updated = heartbeats.until(lambda seen: seen[-1].model_version == "0.2.0", 30, "heartbeat of 0.2.0", edge)
        assert updated[-1].model_sha256 == release.sha256

        publish_readings(mosquitto, "plant7/telemetry", range(6, 10))
        predictions.until(lambda seen: any(p.model_version == "0.2.0" for p in seen), 30, "predictions of 0.2.0", edge)
    finally:
        edge.send_signal(signal.SIGTERM)
        code = edge.wait(30)
        log.close()
        predictions.consumer.close()
        heartbeats.consumer.close()
    output = (tmp_path / "edge.log").read_text()
    assert code == 0, output[-3000:]
