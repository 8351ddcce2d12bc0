"""The edge's MQTT source against a real Mosquitto with TLS and passwords (``allow_anonymous false``): it reads over TLS
with its password, and a wrong password, no login or a CA that does not vouch for the broker fail at once with an
error that says which, instead of retrying for ever in silence."""

from __future__ import annotations

import getpass
import json
import logging
import secrets
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from edge_agent.config import ConfigError, EdgeConfig, MqttSource
from edge_agent.mqtt import MqttRefused, MqttSubscription
from edge_agent.parsing import Reading
from infra.processes import free_ports
from tests.fixtures_tls import TestCA

pytestmark = pytest.mark.integration

MOSQUITTO = Path("/usr/sbin/mosquitto")
MOSQUITTO_PASSWD = Path("/usr/bin/mosquitto_passwd")
EDGE_USER, PUBLISHER_USER = "edge-plant-a", "plc-gateway"
# Random, so that finding one in a log can only mean it leaked.
EDGE_PASSWORD = f"edge-{secrets.token_urlsafe(12)}"
PUBLISHER_PASSWORD = f"plc-{secrets.token_urlsafe(12)}"
T0 = 1_767_225_600


@dataclass(frozen=True)
class SecuredMosquitto:
    port: int
    mutual_port: int  # this listener also requires a client certificate signed by the CA
    ca: TestCA
    impostor: TestCA
    directory: Path


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredMosquitto]:
    directory = tmp_path_factory.mktemp("mosquitto-tls")
    ca = TestCA(directory / "ca")
    server = ca.issue("mqtt-broker")
    passwords = directory / "passwd"
    passwords.touch(mode=0o600)
    for user, password in ((EDGE_USER, EDGE_PASSWORD), (PUBLISHER_USER, PUBLISHER_PASSWORD)):
        subprocess.run([str(MOSQUITTO_PASSWD), "-b", str(passwords), user, password], check=True)
    port, mutual_port = free_ports(2)
    tls = f"cafile {ca.cert_file}\ncertfile {server.cert_file}\nkeyfile {server.key_file}\n"
    config = directory / "mosquitto.conf"
    config.write_text(
        f"user {getpass.getuser()}\n"  # as root, mosquitto would switch to a user that cannot read these files
        "allow_anonymous false\n"
        f"password_file {passwords}\n"
        "persistence false\n"
        f"log_dest file {directory}/mosquitto.log\n"
        f"listener {port} 127.0.0.1\n{tls}"
        f"listener {mutual_port} 127.0.0.1\n{tls}require_certificate true\n"
    )
    process = subprocess.Popen([str(MOSQUITTO), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not _listening(port) or not _listening(mutual_port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start: {process.stderr.read() if process.stderr else ''}")
            time.sleep(0.05)
        yield SecuredMosquitto(port, mutual_port, ca, TestCA(directory / "impostor", "impostor-ca"), directory)
    finally:
        process.terminate()  # by the pid this fixture started
        process.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _source(broker: SecuredMosquitto, topic: str, **overrides: Any) -> MqttSubscription:
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": broker.port,
        "topics": [topic],
        "client_id": f"edge-{secrets.token_hex(4)}",
        "tls": True,
        "ca_file": broker.ca.cert_file,
        "username": EDGE_USER,
        "password": EDGE_PASSWORD,
    }
    return MqttSubscription(MqttSource(**(settings | overrides)), edge_id=EDGE_USER)


def _publish(broker: SecuredMosquitto, topic: str, values: range) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{secrets.token_hex(4)}", protocol=paho.MQTTv5)
    client.tls_set(ca_certs=str(broker.ca.cert_file), cert_reqs=ssl.CERT_REQUIRED)
    client.username_pw_set(PUBLISHER_USER, PUBLISHER_PASSWORD)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for v in values:
            payload = json.dumps({"timestamp": T0 + 60 * v, "machine_id": "m1", "temp": v})
            client.publish(topic, payload, qos=1).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()


def _read(broker: SecuredMosquitto, source: MqttSubscription, topic: str, count: int) -> list[float]:
    """Subscribe, publish ``count`` readings once subscribed, and return the values the source yields."""
    stop = threading.Event()
    values: list[float] = []
    published = False
    deadline = time.monotonic() + 15
    try:
        for batch in source.batches(None, stop):
            values += [item.values[0] for item in batch.items if isinstance(item, Reading)]
            source.acknowledge(batch.ack)
            if source.subscribed and not published:
                _publish(broker, topic, range(count))
                published = True
            if len(values) >= count or time.monotonic() > deadline:
                break
    finally:
        source.close()
    return values


def _refusal(source: MqttSubscription, within_s: float = 10.0) -> MqttRefused:
    deadline = time.monotonic() + within_s
    with pytest.raises(MqttRefused) as refused:
        for _ in source.batches(None, threading.Event()):
            if time.monotonic() > deadline:
                break
    assert source.refused is refused.value
    return refused.value


def test_the_source_reads_readings_over_tls_with_its_password(
    mosquitto: SecuredMosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    source = _source(mosquitto, "plant/secured")
    assert _read(mosquitto, source, "plant/secured", 5) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert source.refused is None
    assert EDGE_PASSWORD not in caplog.text + repr(source.spec) + str(source.spec.model_dump())


def test_a_client_certificate_is_presented_where_the_broker_requires_one(mosquitto: SecuredMosquitto) -> None:
    issued = mosquitto.ca.issue("edge-plant-a-client")
    with pytest.raises(ValidationError, match="cert_file and key_file go together"):
        _source(mosquitto, "plant/mutual", cert_file=issued.cert_file)
    source = _source(
        mosquitto, "plant/mutual", port=mosquitto.mutual_port, cert_file=issued.cert_file, key_file=issued.key_file
    )
    for _ in source.batches(None, threading.Event()):
        if source.connected:
            break
    source.close()
    assert source.refused is None and source.last_error is None

    # The control: without the certificate, the same listener lets nothing in.
    anonymous = _source(mosquitto, "plant/mutual", port=mosquitto.mutual_port)
    deadline = time.monotonic() + 2
    for _ in anonymous.batches(None, threading.Event()):
        if anonymous.connected or time.monotonic() > deadline:
            break
    anonymous.close()
    assert not anonymous.connected and anonymous.last_error is not None


def test_a_wrong_password_fails_with_an_error_that_says_so(
    mosquitto: SecuredMosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = f"wrong-{secrets.token_urlsafe(8)}"
    refused = _refusal(_source(mosquitto, "plant/x", password=wrong))
    assert f"refused the login as user '{EDGE_USER}'" in str(refused)
    assert "bad user name or password" in str(refused) or "not authorized" in str(refused)
    assert wrong not in caplog.text + str(refused)


def test_no_login_fails_with_an_error_that_says_so(mosquitto: SecuredMosquitto) -> None:
    refused = _refusal(_source(mosquitto, "plant/x", username=None, password=None))
    assert "refused the login without a username" in str(refused)


def test_a_ca_that_does_not_vouch_for_the_broker_fails_with_an_error_that_says_so(mosquitto: SecuredMosquitto) -> None:
    refused = _refusal(_source(mosquitto, "plant/x", ca_file=mosquitto.impostor.cert_file))
    assert "certificate was not accepted" in str(refused)
    assert str(mosquitto.impostor.cert_file) in str(refused)


def test_tls_files_without_tls_and_passwords_in_config_errors_are_refused_or_hidden(tmp_path: Path) -> None:
    def config(source: dict[str, Any]) -> EdgeConfig:
        return EdgeConfig.from_dict({"edge_id": "e1", "sources": [{"type": "mqtt", "topics": ["a"], **source}]})

    with pytest.raises(ConfigError, match="ca_file take effect only with tls: true"):
        config({"ca_file": "ca.pem"})
    with pytest.raises(ConfigError, match="cert_file and key_file go together") as refused:
        config({"tls": True, "cert_file": "c.pem", "username": "u", "password": "hunter2-hunter2"})
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        config({"username": "u", "password": 31415926535})
    assert "31415926535" not in str(refused.value)
    resolved = EdgeConfig.from_dict(
        {
            "edge_id": "e1",
            "sources": [{"type": "mqtt", "topics": ["a"], "tls": True, "cert_file": "c.pem", "key_file": "c.key"}],
        },
        base=tmp_path,
    ).sources[0]
    assert isinstance(resolved, MqttSource)
    assert (resolved.cert_file, resolved.key_file) == (tmp_path / "c.pem", tmp_path / "c.key")


def test_an_mqtt_source_error_does_not_print_the_password() -> None:
    with pytest.raises(ValidationError, match="password needs username") as refused:
        MqttSource(topics=["a"], password="hunter2-hunter2")
    assert "hunter2" not in str(refused.value)
