"""The MQTT source against a real Mosquitto broker: QoS 1 with manual acknowledgement, so a message the agent has
not committed is delivered again after a restart, and one it acknowledged is not."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.config import EdgeConfig, MqttSource
from edge_agent.daemon import AgentDaemon
from edge_agent.mqtt import MqttSubscription
from edge_agent.outbox import Outbox
from edge_agent.parsing import Reading
from edge_agent.telemetry_source import SourceBatch
from precursor.contracts.messages import Prediction, decode
from tests.fixtures_edge import Mosquitto, publisher, wait_for

pytestmark = pytest.mark.integration

T0 = 1_767_225_600
MARKER = "marker"
"""The machine of a reading published only to learn that everything before it has arrived."""


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


class Subscriber:
    def __init__(self, broker: Mosquitto, client_id: str, topic: str) -> None:
        self.broker, self.client_id = broker, client_id
        spec = MqttSource(port=broker.port, topics=[topic], client_id=client_id)
        self.source = MqttSubscription(spec, edge_id="unused")
        self.batches: list[SourceBatch] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for batch in self.source.batches(None, self.stop):
            self.batches.append(batch)

    def readings(self) -> list[Reading]:
        return [i for b in self.batches for i in b.items if isinstance(i, Reading)]

    def values(self) -> list[float]:
        return [r.values[0] for r in self.readings() if r.machine_id != MARKER]

    def subscribed(self) -> None:
        wait_for(lambda: self.source.subscribed, 10, what="the subscription confirmed")

    def settled(self, broker: Mosquitto, topic: str) -> None:
        """Wait until everything the broker holds for this session has arrived: it delivers a session's messages in
        order, so whatever it still had comes before a marker published now."""
        before = sum(r.machine_id == MARKER for r in self.readings())
        publish(broker, topic, range(1), machine_id=MARKER)
        wait_for(lambda: sum(r.machine_id == MARKER for r in self.readings()) > before, 10, what="the marker")

    def acknowledge_all(self) -> None:
        for batch in self.batches:
            self.source.acknowledge(batch.ack)

    def close(self) -> None:
        """Stop, and wait until the broker has handled the disconnection: a client that connects with the same id
        before then takes the session over, and the broker drops whatever of this one's it had not read yet (its last
        acknowledgements, which would then come back as redeliveries)."""
        before = self.broker.disconnections(self.client_id)
        self.stop.set()
        self.thread.join(5)
        self.source.close()
        wait_for(lambda: self.broker.disconnections(self.client_id) > before, 10, what="the broker's disconnect")


def publish(broker: Mosquitto, topic: str, values: range, machine_id: str = "m1") -> None:
    client = publisher(broker.port, client_id=f"pub-{time.monotonic_ns()}")
    for v in values:
        payload = json.dumps({"timestamp": T0 + 60 * v, "machine_id": machine_id, "temp": v})
        client.publish(topic, payload, qos=1).wait_for_publish(5)
    client.loop_stop()
    client.disconnect()


def test_unacknowledged_messages_come_back_after_a_restart_and_acknowledged_ones_do_not(mosquitto: Mosquitto) -> None:
    topic = "plant/ack-test"
    first = Subscriber(mosquitto, "edge-ack", topic)
    first.subscribed()
    publish(mosquitto, topic, range(20))
    wait_for(lambda: len(first.values()) == 20, 10, what="20 readings")
    # The agent committed only what the first batches held, then died.
    acked: list[float] = []
    for batch in first.batches:
        if len(acked) >= 5:
            break
        first.source.acknowledge(batch.ack)
        acked += [i.values[0] for i in batch.items if isinstance(i, Reading)]
    first.close()  # its PUBACKs go out before the DISCONNECT: one ordered stream

    second = Subscriber(mosquitto, "edge-ack", topic)
    second.subscribed()
    second.settled(mosquitto, topic)
    assert sorted(second.values()) == [float(v) for v in range(20) if float(v) not in acked]
    second.acknowledge_all()
    second.close()

    third = Subscriber(mosquitto, "edge-ack", topic)
    third.subscribed()
    third.settled(mosquitto, topic)
    assert third.values() == []
    third.close()


def test_messages_sent_while_the_agent_is_away_wait_in_its_session(mosquitto: Mosquitto) -> None:
    topic = "plant/away"
    first = Subscriber(mosquitto, "edge-away", topic)
    first.subscribed()
    first.close()
    publish(mosquitto, topic, range(5))
    second = Subscriber(mosquitto, "edge-away", topic)
    second.subscribed()
    second.settled(mosquitto, topic)
    assert second.values() == [0.0, 1.0, 2.0, 3.0, 4.0]  # all of them, once each, in the order they were sent
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
    wait_for(lambda: getattr(source, "subscribed", False), 10, what="the subscription confirmed")
    publish(mosquitto, topic, range(31))  # 30 minutes of one reading a minute: 6 windows
    wait_for(lambda: daemon.agent.stats.readings == 31 and daemon.outbox.staged == 0, 10, what="readings committed")
    wait_for(lambda: getattr(source, "acknowledged", 0) == 31, 10, what="acknowledgements")
    daemon.request_stop()
    runner.join(20)
    assert not runner.is_alive()
    wait_for(lambda: mosquitto.disconnections("edge-mqtt-d") == 1, 10, what="the broker's disconnect")

    box = Outbox(config.state_dir / "outbox.sqlite", max_bytes=10**8)
    predictions = [decode(Prediction, r.value) for r in box.reader().pending(1000) if r.kind == "prediction"]
    assert [p.window_end.timestamp() - T0 for p in predictions] == [300.0 * k for k in range(1, 7)]

    again = Subscriber(mosquitto, "edge-mqtt-d", topic)  # everything was acknowledged: nothing comes back
    again.subscribed()
    again.settled(mosquitto, topic)
    assert again.values() == []
    again.close()
