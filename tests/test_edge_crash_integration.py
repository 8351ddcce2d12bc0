"""The agent killed with SIGKILL mid-stream and started again: nothing acknowledged to a source is lost and nothing
is stored twice. Two sources at once, a growing CSV file (tail) and an MQTT topic (QoS 1), into the real Kafka
broker and the prediction store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from edge_agent.config import MqttSource
from edge_agent.mqtt import MqttSubscription
from pipelines.run import run_once
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_edge import Mosquitto, TelemetryWriter, expected_windows, wait_for
from tests.test_edge_outage_integration import stored_predictions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
EDGE = "edge-crash"


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    yield broker
    broker.stop()


def start_agent(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "edge_agent.daemon", "--config", str(config)], stdout=out, stderr=out, env=env
        )


def committed_offset(state: Path) -> int:
    """The tail's saved offset: proof the agent committed (and, for MQTT, acknowledged) something."""
    db = state / "outbox.sqlite"
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = con.execute("SELECT position FROM positions WHERE source LIKE 'tail:%'").fetchone()
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()
    return 0 if row is None else int(json.loads(row[0])["offset"])


def test_sigkill_mid_stream_loses_nothing_acknowledged_and_stores_nothing_twice(
    tmp_path: Path, kafka_settings: KafkaSettings, mosquitto: Mosquitto
) -> None:
    topic = "plant/crash"
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "edge_id": EDGE,
                "kafka": {
                    "bootstrap_servers": kafka_settings.bootstrap_servers,
                    "topic_prefix": kafka_settings.topic_prefix,
                },
                "sources": [
                    {"type": "tail", "path": "telemetry.csv", "poll": "0.05s"},
                    {"type": "mqtt", "port": mosquitto.port, "topics": [topic], "client_id": EDGE},
                ],
                "window": {"length": "2m", "every": "1m", "min_points": 3},
                "health": {"enabled": False},
                "updates": {"enabled": False},
                "exit_when_sources_end": False,
                "state_dir": "state",
            }
        )
    )
    log = tmp_path / "agent.log"
    writer = TelemetryWriter(
        tmp_path / "telemetry.csv",
        [f"t-{i}" for i in range(4)],
        mqtt_port=mosquitto.port,
        mqtt_topic=topic,
        mqtt_machines=[f"q-{i}" for i in range(4)],
        step_s=10,
        tick_s=0.05,
    )
    # The agent's MQTT session exists before the stream starts (as it would in a plant): from then on the broker
    # keeps every message for it, also while it is down.
    session = MqttSubscription(MqttSource(port=mosquitto.port, topics=[topic], client_id=EDGE), edge_id=EDGE)
    session.start()
    wait_for(lambda: session.subscribed, 10, what="the MQTT session's subscription")
    session.close()
    writer.start()
    agent = start_agent(config, log)
    try:
        wait_for(lambda: committed_offset(tmp_path / "state") > 20_000, 30, what="the stream flowing")
        agent.send_signal(signal.SIGKILL)  # no chance to flush anything
        assert agent.wait(10) == -signal.SIGKILL
        killed_at = len(writer.written)
        # The stream goes on while the agent is down (20 steps of its 8 machines): the file grows, MQTT queues in the
        # session.
        wait_for(lambda: len(writer.written) >= killed_at + 160, 30, what="the stream going on while the agent is down")
        agent = start_agent(config, log)
        wait_for(lambda: len(writer.written) > killed_at + 800, 30, what="more stream after the restart")
    finally:
        writer.finish()

    expected = expected_windows(writer.written, every_s=60, length_s=120, min_points=3)
    store = tmp_path / "store.duckdb"

    def all_stored() -> bool:
        run_once(kafka_settings, store)
        return len({(m, end) for m, end, _ in stored_predictions(store, EDGE)}) >= len(expected)

    try:
        wait_for(all_stored, 60, interval_s=1.0, what=f"{len(expected)} windows in the store")
    except AssertionError:
        pass  # the assertions below say what is missing
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(30)
    assert code == 0, log.read_text()[-3000:]
    run_once(kafka_settings, store)
    rows = stored_predictions(store, EDGE)
    windows = {(m, end) for m, end, _ in rows}
    assert {m for m, _ in windows} == {f"t-{i}" for i in range(4)} | {f"q-{i}" for i in range(4)}
    missing, extra = sorted(expected - windows), sorted(windows - expected)
    assert not missing and not extra, f"missing {len(missing)}: {missing[:10]}; unexpected {len(extra)}: {extra[:10]}"
    assert len(rows) == len(windows)  # nothing stored twice
