"""The MQTT source against a real Mosquitto broker: QoS 1 with manual acknowledgement, so a message the agent has
not committed is delivered again after a restart, and one it acknowledged is not."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.messages import Prediction, decode
from edge_agent.config import EdgeConfig, MqttSource
from edge_agent.daemon import AgentDaemon
from edge_agent.mqtt import MqttSubscription
from edge_agent.outbox import Outbox
from edge_agent.records import Reading
from edge_agent.telemetry_source import SourceBatch
from tests.test_edge_support import Mosquitto, publisher, wait_for

pytestmark = pytest.mark.integration

T0 = 1_767_225_600


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


class Subscriber:
    def __init__(self, broker: Mosquitto, client_id: str, topic: str) -> None:
        spec = MqttSource(port=broker.port, topics=[topic], client_id=client_id)
        self.source = MqttSubscription(spec, edge_id="unused")
        self.batches: list[SourceBatch] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for batch in self.source.batches(None, self.stop):
            self.batches.append(batch)

    def values(self) -> list[float]:
        return [i.values[0] for b in self.batches for i in b.items if isinstance(i, Reading)]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.source.close()


def publish(broker: Mosquitto, topic: str, values: range) -> None:
    client = publisher(broker.port, client_id=f"pub-{time.monotonic_ns()}")
    for v in values:
        payload = json.dumps({"timestamp": T0 + 60 * v, "machine_id": "m1", "temp": v})
        client.publish(topic, payload, qos=1).wait_for_publish(5)
    client.loop_stop()
    client.disconnect()


def test_unacknowledged_messages_come_back_after_a_restart_and_acknowledged_ones_do_not(mosquitto: Mosquitto) -> None:
    topic = "plant/ack-test"
    first = Subscriber(mosquitto, "edge-ack", topic)
    wait_for(lambda: first.source.connected, 10, what="connected")
    time.sleep(0.3)  # let the subscription settle
    publish(mosquitto, topic, range(20))
    wait_for(lambda: len(first.values()) == 20, 10, what="20 readings")
    # The agent committed only what the first batches held, then died.
    acked: list[float] = []
    for batch in first.batches:
        if len(acked) >= 5:
            break
        first.source.acknowledge(batch.ack)
        acked += [i.values[0] for i in batch.items if isinstance(i, Reading)]
    time.sleep(0.3)  # PUBACKs on the wire before the connection goes
    first.close()

    second = Subscriber(mosquitto, "edge-ack", topic)
    expected = [float(v) for v in range(20) if float(v) not in acked]
    wait_for(lambda: len(second.values()) >= len(expected), 10, what="redelivery")
    time.sleep(0.3)
    assert sorted(second.values()) == expected
    for batch in second.batches:
        second.source.acknowledge(batch.ack)
    time.sleep(0.3)
    second.close()

    third = Subscriber(mosquitto, "edge-ack", topic)
    wait_for(lambda: third.source.connected, 10, what="connected")
    time.sleep(1.0)
    assert third.values() == []
    third.close()


def test_messages_sent_while_the_agent_is_away_wait_in_its_session(mosquitto: Mosquitto) -> None:
    topic = "plant/away"
    first = Subscriber(mosquitto, "edge-away", topic)
    wait_for(lambda: first.source.connected, 10, what="connected")
    time.sleep(0.3)
    first.close()
    publish(mosquitto, topic, range(5))
    second = Subscriber(mosquitto, "edge-away", topic)
    wait_for(lambda: len(second.values()) == 5, 10, what="queued messages")
    second.close()


def test_the_daemon_turns_mqtt_readings_into_predictions_and_acknowledges_them(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    topic = "plant/daemon"
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-mqtt",
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},  # no broker: everything stays in the outbox
            "sources": [{"type": "mqtt", "port": mosquitto.port, "topics": [topic], "client_id": "edge-mqtt-d"}],
            "window": {"length": "10m", "every": "5m", "min_points": 2},
            "health": {"enabled": False},
            "exit_when_sources_end": False,
            "drain_timeout": "0s",
            "state_dir": "state",
        },
        base=tmp_path,
    )
    daemon = AgentDaemon(config)
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    source = daemon.sources[0]
    wait_for(lambda: getattr(source, "connected", False), 10, what="connected")
    time.sleep(0.3)
    publish(mosquitto, topic, range(31))  # 30 minutes of one reading a minute: 6 windows
    wait_for(lambda: daemon.agent.stats.readings == 31 and daemon.outbox.staged == 0, 10, what="readings committed")
    wait_for(lambda: getattr(source, "acknowledged", 0) == 31, 10, what="acknowledgements")
    daemon.request_stop()
    runner.join(20)
    assert not runner.is_alive()

    box = Outbox(config.state_dir / "outbox.sqlite", max_bytes=10**8)
    predictions = [decode(Prediction, r.value) for r in box.reader().pending(1000) if r.kind == "prediction"]
    assert [p.window_end.timestamp() - T0 for p in predictions] == [300.0 * k for k in range(1, 7)]

    again = Subscriber(mosquitto, "edge-mqtt-d", topic)  # everything was acknowledged: nothing comes back
    wait_for(lambda: again.source.connected, 10, what="connected")
    time.sleep(1.0)
    assert again.values() == []
    again.close()
