"""Helpers the edge agent's tests share: a real Mosquitto broker, tiny signed LM artifacts, a telemetry writer that
keeps a file and an MQTT topic growing, the windows a stream must produce (worked out independently of the agent's
window builder), and waiting on a condition with a deadline.
"""

from __future__ import annotations

import getpass
import itertools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from infra.processes import free_ports
from models.edge.scoring import Window

MOSQUITTO = Path("/usr/sbin/mosquitto")


class Mosquitto:
    """A real MQTT broker from Debian's ``mosquitto`` package, on a free port, with its own config and data folder.

    Persistent sessions keep queued QoS 1 messages for clients that are away, which is what the agent relies on.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_ports(1)[0]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> Mosquitto:
        if not MOSQUITTO.exists():
            raise RuntimeError(
                f"{MOSQUITTO} is missing: install Debian's mosquitto package (apt-get install mosquitto)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "mosquitto.conf"
        config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"user {getpass.getuser()}\n"  # as root, mosquitto would switch to a user that cannot write its log here
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.directory}/\n"
            "max_queued_messages 1000000\n"
            "max_inflight_messages 0\n"
            f"log_dest file {self.directory}/mosquitto.log\n"
        )
        self.process = subprocess.Popen(
            [str(MOSQUITTO), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.process.returncode}; see {self.directory}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout_s} s")

    def disconnections(self, client_id: str) -> int:
        """How many times the broker has logged ``client_id`` going away: it has then handled everything that
        client sent before (its acknowledgements included)."""
        log = self.directory / "mosquitto.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return text.count(f"Client {client_id} disconnected") + text.count(f"Client {client_id} closed its connection")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()  # by the PID this object started, nothing else
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def publisher(port: int, client_id: str = "test-publisher"):  # type: ignore[no-untyped-def]
    """A connected paho client (MQTT 5) with its network loop running."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


# --- the windows a stream must give -------------------------------------------------------------------------------


def expected_windows(
    readings: Iterable[tuple[str, float]], *, every_s: int, length_s: int, min_points: int
) -> set[tuple[str, int]]:
    """(machine_id, window end) of every window an in-order stream completes, by the documented rule: the window
    ending at boundary b holds the readings in [b - length, b) and is emitted by the first reading at or after b."""
    by_machine: dict[str, list[float]] = {}
    for machine, t in readings:
        by_machine.setdefault(machine, []).append(t)
    out = set()
    for machine, times in by_machine.items():
        times = sorted(times)
        for previous, t in itertools.pairwise(times):
            boundary = int(t // every_s) * every_s
            if boundary > previous:
                count = sum(1 for x in times if boundary - length_s <= x < boundary)
                if count >= min_points:
                    out.add((machine, boundary))
    return out


class TelemetryWriter(threading.Thread):
    """Keeps telemetry flowing: every ``tick_s`` of wall time, event time advances ``step_s`` and each machine
    reports once, to a CSV file (tail machines) and/or an MQTT topic (mqtt machines). ``written`` holds every
    (machine_id, t) written, in order."""

    def __init__(
        self,
        csv_path: Path | None,
        csv_machines: Sequence[str],
        *,
        mqtt_port: int | None = None,
        mqtt_topic: str = "plant/telemetry",
        mqtt_machines: Sequence[str] = (),
        step_s: int = 10,
        tick_s: float = 0.05,
    ) -> None:
        super().__init__(name="telemetry-writer", daemon=True)
        self.csv_path = csv_path
        self.csv_machines = list(csv_machines)
        self.mqtt_port = mqtt_port
        self.mqtt_topic = mqtt_topic
        self.mqtt_machines = list(mqtt_machines)
        self.step_s = step_s
        self.tick_s = tick_s
        self.start_t = (int(time.time()) - 2 * 86400) // 3600 * 3600
        self.t = self.start_t
        self.written: list[tuple[str, float]] = []
        self.stop_event = threading.Event()
        if self.csv_path is not None and not self.csv_path.exists():
            self.csv_path.write_text("timestamp,machine_id,temp,vib,pressure\n")

    def row(self, machine: str, t: int) -> dict[str, object]:
        i = int(machine.rsplit("-", 1)[-1])
        k = (t - self.start_t) // self.step_s
        return {
            "timestamp": datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z"),
            "machine_id": machine,
            "temp": round(40 + i + (k % 17) * 0.3, 3),
            "vib": round(0.1 * (k % 7), 3),
            "pressure": round(3 + (i % 3) / 10 + (k % 5) * 0.01, 3),
        }

    def step(self, client: object | None) -> None:
        t = self.t
        if self.csv_path is not None and self.csv_machines:
            lines = []
            for m in self.csv_machines:
                r = self.row(m, t)
                lines.append(f"{r['timestamp']},{m},{r['temp']},{r['vib']},{r['pressure']}\n")
            with self.csv_path.open("a") as fh:
                fh.write("".join(lines))
            self.written.extend((m, float(t)) for m in self.csv_machines)
        if client is not None:
            for m in self.mqtt_machines:
                info = client.publish(self.mqtt_topic, json.dumps(self.row(m, t)), qos=1)  # type: ignore[attr-defined]
                info.wait_for_publish(timeout=5)
                self.written.append((m, float(t)))
        self.t += self.step_s

    def run(self) -> None:
        client = publisher(self.mqtt_port) if self.mqtt_port is not None and self.mqtt_machines else None
        try:
            while not self.stop_event.is_set():
                self.step(client)
                self.stop_event.wait(self.tick_s)
        finally:
            if client is not None:
                client.loop_stop()
                client.disconnect()

    def finish(self) -> None:
        """Stop writing and wait for the thread."""
        self.stop_event.set()
        self.join(timeout=10)


# --- tiny signed language-model artifacts -------------------------------------------------------------------------


def training_windows(sensors: Sequence[str], machines: int = 6, per_machine: int = 12, seed: int = 0) -> list[Window]:
    rng = np.random.default_rng(seed)
    start = 1_767_225_600
    windows = []
    for m in range(machines):
        for k in range(per_machine):
            end = start + (k + 1) * 3600
            stamps = end - 3600 + np.arange(0, 3600, 300, dtype=np.int64)
            values = rng.normal(m, 1.0 + k / 10, (len(stamps), len(sensors))).astype(np.float32)
            windows.append(
                Window(
                    f"pump-{m:02d}",
                    datetime.fromtimestamp(end - 3600, UTC),
                    datetime.fromtimestamp(end, UTC),
                    stamps,
                    tuple(sensors),
                    values,
                )
            )
    return windows


def build_artifact(
    directory: Path, version: str, signing_key: Path, sensors: Sequence[str] = ("pressure", "temp", "vib")
) -> Path:
    """A real (random-weight) telemetry LM: tokenizer fitted on synthetic windows, a one-layer GPT-2, int8 ONNX,
    signed. Takes a few seconds (torch export); tests build one per module."""
    from models.edge.tokenizer import TelemetryTokenizer, TokenizerSettings
    from models.training.export import export_artifact
    from models.training.model import CheckpointMeta, ModelConfig, build_model, count_parameters, save_checkpoint

    windows = training_windows(sensors)
    tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=1, blocks=2, bins=8, min_machine_rows=5))
    tokenizer.fit(windows, ["bearing"])
    model = build_model(
        ModelConfig(
            vocab_size=tokenizer.vocab_size, n_positions=tokenizer.settings.max_length, n_embd=32, n_layer=1, n_head=2
        )
    ).eval()
    meta = CheckpointMeta(
        parameters=count_parameters(model),
        horizon_h=24,
        threshold=0.5,
        window={"window_h": 1, "every_h": 1, "min_points": 3, "event_lookback_h": 72},
        tokenizer_hash=tokenizer.content_hash,
    )
    checkpoint = save_checkpoint(directory / f"checkpoint-{version}", model, tokenizer, meta)
    return export_artifact(checkpoint, directory / f"artifact-{version}", version, signing_key, windows[:40])


def resign(source: Path, out: Path, version: str, signing_key: Path) -> Path:
    """A copy of an artifact signed again, as another version and/or by another key (a cheap second artifact)."""
    import shutil

    from models.edge.registry import MANIFEST_FILE, SIGNATURE_FILE, sign_artifact
    from models.edge.signing import load_private_key

    shutil.copytree(source, out)
    (out / MANIFEST_FILE).unlink()
    (out / SIGNATURE_FILE).unlink()
    manifest = json.loads((source / MANIFEST_FILE).read_text())
    sign_artifact(out, model_name=manifest["model_name"], version=version, private_key=load_private_key(signing_key))
    return out


def wait_for(condition, timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise AssertionError(f"{what} not met within {timeout_s} s")
