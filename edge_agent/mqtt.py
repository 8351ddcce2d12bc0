"""An MQTT subscription as a telemetry source (paho-mqtt 2, MQTT 5, QoS 1, persistent session).

Acknowledgement is manual: paho's automatic PUBACK would tell the broker a reading is safe before the agent wrote
anything. Here a message is acknowledged only after the agent committed what it led to (its window rows, the
predictions it completed) to the outbox. If the agent dies in between, the broker still holds the message in the
session and delivers it again after the restart; a reading the agent had in fact committed is then a repeat, which
the window builder drops (same machine, same instant). Messages that arrive while the agent is down wait in the
persistent session (``session_expiry``); ``receive_maximum`` bounds how many are in flight unacknowledged.

Packet ids are per connection: an id received before a reconnect must not be acknowledged after it (it could name
another message), so each delivery remembers its connection and stale ones are left for the broker to resend.

Payloads are JSON: one reading or event in the generic format, or an array of them.

The connection is TLS with ``tls: true`` (the broker's certificate checked against ``ca_file``, a client certificate
from ``cert_file``/``key_file`` where the broker asks for one) and logs in with ``username``/``password``. A broker
that is away is retried for ever; one that refuses this source (wrong password, not authorized, a certificate that
``ca_file`` does not vouch for) is not: retrying cannot mend that, so the source fails with :class:`MqttRefused`,
which names the reason, and the agent reports it.
"""

from __future__ import annotations

import logging
import queue
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.config import InputSpec, MqttSource, source_name
from edge_agent.parsing import RecordParser
from edge_agent.telemetry_source import Item, SourceBatch
from precursor.contracts.formats import read_machines

log = logging.getLogger("precursor.edge.mqtt")

_BATCH = 512
# CONNACK reasons that the same settings will get again (MQTT 5 codes; paho maps MQTT 3.1.1's onto them).
_REFUSALS = {
    133: "the client id is not valid",
    134: "bad user name or password",
    135: "not authorized",
    138: "banned",
    140: "bad authentication method",
}


class MqttRefused(ConnectionError):
    """The MQTT broker, or its certificate, refused this source for good; the message says why and what to check."""


class MqttSubscription:
    def __init__(self, spec: MqttSource, *, edge_id: str, limits: InputSpec | None = None) -> None:
        self.spec = spec
        self.name = source_name(spec)
        limits = limits or InputSpec()
        self.parser = RecordParser(self.name, max_sensors=limits.max_sensors, max_record_bytes=limits.max_record_bytes)
        self.client_id = spec.client_id or f"precursor-edge-{edge_id}"
        self._inbox: queue.Queue[tuple[int, int, int, str, bytes]] = queue.Queue()
        self._generation = 0
        self._lock = threading.Lock()
        self.connected = False
        self.subscribed = False
        """The broker confirmed the subscriptions of this connection (SUBACK): messages published from now on reach
        us."""
        self.refused: MqttRefused | None = None
        self.last_error: str | None = None
        self.received = 0
        self.acknowledged = 0
        self._client: paho.Client | None = None

    def attributes(self) -> dict[str, dict[str, str]]:
        return read_machines(self.spec.machines) if self.spec.machines else {}

    # --- the connection (paho's network thread calls these) -----------------------------------------------------

    def _on_connect(self, client: paho.Client, _userdata: object, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            if reason.value in _REFUSALS:
                login = f"as user {self.spec.username!r}" if self.spec.username else "without a username"
                self._refuse(client, f"refused the login {login}: {_REFUSALS[reason.value]} (check username/password)")
            else:
                self._note(f"connect refused: {reason}")
            return
        with self._lock:
            self._generation += 1
        self.connected = True
        self.subscribed = False
        self.last_error = None
        options = SubscribeOptions(qos=1)
        client.subscribe([(topic, options) for topic in self.spec.topics])
        log.info(
            "MQTT connected to %s:%s, subscribed to %s",
            self.spec.host,
            self.spec.port,
            ", ".join(self.spec.topics),
            extra={"source": self.name},
        )

    def _on_connect_fail(self, client: paho.Client, _userdata: object) -> None:
        # paho calls this inside its ``except OSError``, and passes no error: the active exception is the reason.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLCertVerificationError):
            trusted = f"ca_file={self.spec.ca_file}" if self.spec.ca_file else "the system's CAs"
            self._refuse(
                client,
                f"TLS: its certificate was not accepted ({error.verify_message}): is it signed by {trusted}, "
                f"for the host {self.spec.host}?",
            )
        else:
            self._note(f"cannot connect: {error}")

    def _refuse(self, client: paho.Client, why: str) -> None:
        self.refused = MqttRefused(f"MQTT broker {self.spec.host}:{self.spec.port} {why} [source {self.name}]")
        self.last_error = str(self.refused)
        log.error("%s", self.refused, extra={"source": self.name})
        client.disconnect()  # ends paho's retry loop: the same settings would be refused again

    def _note(self, error: str) -> None:
        if error != self.last_error:  # once per new reason, not once per retry
            log.warning("MQTT %s:%s: %s; retrying", self.spec.host, self.spec.port, error, extra={"source": self.name})
        self.last_error = error

    def _on_subscribe(self, _client: paho.Client, _userdata: object, _mid: int, reasons: Any, _props: Any) -> None:
        self.subscribed = not any(getattr(r, "is_failure", False) for r in reasons)

    def _on_disconnect(self, _client: paho.Client, _userdata: object, _flags: Any, reason: Any, _props: Any) -> None:
        self.connected = False
        self.subscribed = False
        if getattr(reason, "is_failure", False) and self.refused is None:
            self.last_error = f"disconnected: {reason}"
        log.warning("MQTT disconnected from %s:%s: %s", self.spec.host, self.spec.port, reason)

    def _on_message(self, _client: paho.Client, _userdata: object, message: paho.MQTTMessage) -> None:
        self.received += 1
        self._inbox.put((self._generation, message.mid, message.qos, message.topic, message.payload))

    def _connect(self) -> paho.Client:
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=paho.MQTTv5,
            manual_ack=True,
        )
        if self.spec.username:
            password = self.spec.password.get_secret_value() if self.spec.password else None
            client.username_pw_set(self.spec.username, password)
        if self.spec.tls:
            client.tls_set(
                ca_certs=str(self.spec.ca_file) if self.spec.ca_file else None,
                certfile=str(self.spec.cert_file) if self.spec.cert_file else None,
                keyfile=str(self.spec.key_file) if self.spec.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = int(self.spec.session_expiry.total_seconds())
        properties.ReceiveMaximum = self.spec.receive_maximum
        # connect_async + loop_start: the network thread keeps retrying if the broker is not up yet.
        client.connect_async(
            self.spec.host, self.spec.port, keepalive=self.spec.keepalive, clean_start=False, properties=properties
        )
        client.loop_start()
        return client

    # --- the source interface -----------------------------------------------------------------------------------

    def batches(self, position: str | None, stop: threading.Event) -> Iterator[SourceBatch]:
        """Messages as they arrive. ``position`` is unused: the broker's session is the position."""
        self.start()
        # The client stays connected when this ends: the agent still acknowledges what it commits while stopping,
        # then calls close().
        while not stop.is_set():
            if self.refused is not None:
                self.close()
                raise self.refused
            try:
                first = self._inbox.get(timeout=0.1)
            except queue.Empty:
                yield SourceBatch(self.name, [])  # nothing new: the agent may commit and send heartbeats
                continue
            started = time.monotonic()
            deliveries = [first]
            while len(deliveries) < _BATCH:
                try:
                    deliveries.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            items: list[Item] = []
            acks = []
            for generation, mid, qos, _topic, payload in deliveries:
                items.extend(self.parser.json_line(payload, mid))
                if qos > 0:
                    acks.append((generation, mid, qos))
            yield SourceBatch(self.name, items, None, ack=acks, arrived=started)

    def start(self) -> None:
        """Connect and subscribe (in the background, retrying until the broker answers). :meth:`batches` calls it."""
        if self._client is None:
            self._client = self._connect()

    def acknowledge(self, ack: Any) -> None:
        client = self._client
        if client is None or not ack:
            return
        with self._lock:
            generation = self._generation
        for delivered_in, mid, qos in ack:
            if delivered_in == generation:
                client.ack(mid, qos)
                self.acknowledged += 1

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()
            self.connected = False
            self.subscribed = False
