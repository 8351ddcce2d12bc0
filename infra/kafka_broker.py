"""A local Apache Kafka broker in KRaft mode, run from jars that Maven resolves: no Docker, no release tarball.

Everything the broker needs lives under one state folder (``.state/`` in the current directory by default, or
``$PRECURSOR_STATE_DIR``)::

    <state>/kafka/lib/<pom hash>/*.jar    resolved once per pom, shared by every broker started from this state
    <state>/kafka/data/                   KRaft metadata and topic logs
    <state>/kafka/server.properties       written on every start from the settings below
    <state>/kafka/log4j.properties
    <state>/kafka/logs/server.log         the broker's own log; logs/broker.out holds what the JVM prints itself
    <state>/kafka/broker.pid

``down`` stops a process only after checking that its command line is ``kafka.Kafka`` with this state folder's
properties file, so it never touches another broker (or anything else that reused the pid).

Plaintext by default, as a demo on one machine wants. With ``security`` set (:class:`BrokerSecurity`), the client
listener speaks SASL_SSL only (TLS, then SCRAM-SHA-512), the broker authenticates to its controller with its own
certificate (mutual TLS), and ``StandardAuthorizer`` enforces ACLs: the admin user is the one super user, everybody
else may do only what an ACL grants (see :func:`infra.kafka_admin.edge_acls`).

>>> broker = LocalKafka(state_dir="/tmp/precursor-state", port=19092, controller_port=19093)
>>> broker.bootstrap
'127.0.0.1:19092'
>>> str(broker.properties_file)
'/tmp/precursor-state/kafka/server.properties'
>>> LocalKafka(port=9092, controller_port=9092)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for LocalKafka
  Value error, controller_port=9092 must differ from port=9092 ...
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import secrets
import subprocess
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.kafka_admin import TopicsEnsured, broker_reachable, ensure_topics, list_topics
from infra.maven_jars import MissingToolError, find_executable, resolve_runtime_jars
from infra.processes import BackgroundProcess, port_in_use
from infra.service_settings import AbsolutePath, Port
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import Topics

__all__ = [
    "KAFKA_POM",
    "BrokerError",
    "BrokerSecurity",
    "BrokerStatus",
    "LocalKafka",
    "MissingToolError",
    "TopicsEnsured",
    "broker_reachable",
    "ensure_topics",
]

log = logging.getLogger(__name__)

KAFKA_POM = Path(__file__).parent / "maven" / "kafka" / "pom.xml"
_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_BROKER_MAIN = "kafka.Kafka"
_STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"
_SCRAM_MECHANISM = "SCRAM-SHA-512"
_SCRAM_ITERATIONS = 8192
_CLIENT_LISTENER = {False: "PLAINTEXT", True: "SASL_SSL"}

Report = Callable[[str], None]


class BrokerError(RuntimeError):
    """The local broker could not be started or stopped; the message says why and where its log is."""


class BrokerStatus(BaseModel):
    """What ``precursor kafka status`` shows."""

    model_config = ConfigDict(frozen=True)

    running: bool = Field(description="our broker process is alive")
    reachable: bool = Field(description="it answers metadata requests")
    pid: int | None
    bootstrap: str
    state_dir: Path
    topics: list[str] = Field(default_factory=list, description="non-internal topics, when reachable")


def kafka_version(pom: Path = KAFKA_POM) -> str:
    """The broker version the pom pins (its ``kafka.version`` property)."""
    version = ElementTree.parse(pom).getroot().find("m:properties/m:kafka.version", _MAVEN_NS)
    if version is None or not version.text:
        raise ValueError(f"pom={str(pom)!r} has no <kafka.version> property")
    return version.text.strip()


def new_cluster_id() -> str:
    """A random KRaft cluster id in Kafka's own form: 16 random bytes, URL-safe base64 without padding.

    >>> cluster_id = new_cluster_id()
    >>> len(cluster_id), cluster_id.startswith("-")
    (22, False)
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # Kafka refuses these too: they read as command-line options
            return cluster_id


def _escape_property(value: str) -> str:
    r"""A value as Java's ``Properties.load`` reads it back: backslashes doubled (a Windows path, a password).

    >>> _escape_property('a\\b')
    'a\\\\b'
    """
    return value.replace("\\", "\\\\")


class BrokerSecurity(BaseModel):
    """TLS, SASL/SCRAM-SHA-512 and ACLs for the local broker. Files are PEM.

    ``cert_file`` must name the broker's host (the clients check it) and allow client authentication too (no
    extended key usage, or both serverAuth and clientAuth): the broker presents it to its own controller, which
    takes the certificate's subject as the broker's principal. The admin user gets its SCRAM credential when the
    storage is formatted, before the broker first starts; other users are added through the Admin API
    (:func:`infra.kafka_admin.add_scram_users`), so no password is ever on a command line.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)  # errors print no password

    ca_file: Path = Field(description="the CA that signed cert_file; clients verify the broker against it")
    cert_file: Path = Field(description="the broker's certificate chain")
    key_file: Path = Field(description="the broker's private key, unencrypted PKCS#8, readable by its user only")
    admin_username: str = Field("admin", pattern=r"^[A-Za-z0-9._\-]+$")
    admin_password: SecretStr = Field(min_length=8)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _absolute_file(cls, path: Path) -> Path:
        path = path.expanduser().absolute()
        if not path.is_file():
            raise ValueError(f"{path} is not a file")
        return path

    @field_validator("admin_password")
    @classmethod
    def _one_line(cls, password: SecretStr) -> SecretStr:
        # It goes into a properties file, where a line break would end it early.
        if any(ord(char) < 32 for char in password.get_secret_value()):
            raise ValueError("admin_password must not contain control characters (line breaks, tabs)")
        return password

    def broker_principal(self) -> str:
        """The principal the controller sees for the broker: ``User:`` and the certificate's subject."""
        cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        return f"User:{cert.subject.rfc4514_string()}"

    def scram_credential(self, iterations: int = _SCRAM_ITERATIONS) -> str:
        """The admin's credential as ``kafka-storage format --add-scram`` takes it: salted, never the password."""
        salt = secrets.token_bytes(32)
        # As Kafka's ScramFormatter.saltedPassword: PBKDF2 over the UTF-8 password, no SASLprep.
        salted = hashlib.pbkdf2_hmac("sha512", self.admin_password.get_secret_value().encode(), salt, iterations)
        fields = {
            "name": self.admin_username,
            "salt": base64.b64encode(salt).decode(),
            "saltedpassword": base64.b64encode(salted).decode(),
            "iterations": str(iterations),
        }
        return f"{_SCRAM_MECHANISM}=[{','.join(f'{key}={value}' for key, value in fields.items())}]"


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read: it holds a secret."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an older file of the same name may have had wider permissions
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


class LocalKafka(BaseSettings):
    """A single-node Kafka broker (broker and controller in one process) that this project starts and stops.

    Settings come from arguments, then ``PRECURSOR_LOCAL_KAFKA_*`` variables (``PRECURSOR_STATE_DIR`` for the state
    folder, ``PRECURSOR_KAFKA_TOPIC_PREFIX`` for the topic prefix, as for the clients). ``up`` and ``down`` are
    idempotent.
    """

    model_config = SettingsConfigDict(
        env_prefix="PRECURSOR_LOCAL_KAFKA_", populate_by_name=True, extra="forbid", hide_input_in_errors=True
    )

    # Absolute (as lib_dir), because the pid check compares it with the running broker's command line.
    state_dir: AbsolutePath = Field(
        Path(".state"), validation_alias="PRECURSOR_STATE_DIR", description="where data, logs and the pid file live"
    )
    host: str = Field("127.0.0.1", min_length=1, description="address the broker binds and advertises")
    port: Port = 9092
    controller_port: Port = 9093
    partitions: int = Field(6, ge=1, description="partitions of the multi-partition topics")
    topic_prefix: str = Field(
        "precursor",
        pattern=r"^[A-Za-z0-9._\-]+$",
        validation_alias="PRECURSOR_KAFKA_TOPIC_PREFIX",  # the variable the clients read: both sides agree
        description="prefix of the topics that up creates",
    )
    heap_mb: int = Field(512, ge=128, description="JVM heap ceiling (-Xmx)")
    java_executable: str = "java"
    maven_executable: str = "mvn"
    lib_dir: AbsolutePath | None = Field(None, description="where resolved jars go; <state_dir>/kafka/lib by default")
    security: BrokerSecurity | None = Field(None, description="TLS, SASL/SCRAM and ACLs; plaintext when unset")
    # One node of a cluster (infra.kafka_cluster) differs from a single broker only in these.
    node_id: int = Field(1, ge=1, description="this node's KRaft id")
    quorum_voters: str | None = Field(
        None, description="controller.quorum.voters (id@host:port,...); this node alone when unset"
    )
    cluster_id: str | None = Field(None, description="the KRaft cluster id to format with; a random one when unset")
    replication_factor: int = Field(1, ge=1, description="default replication of topics (internal ones too)")
    min_insync_replicas: int = Field(1, ge=1, description="replicas that must have a write before acks=all returns")

    _service: BackgroundProcess | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _distinct_ports(self) -> LocalKafka:
        if self.port == self.controller_port:
            raise ValueError(f"controller_port={self.controller_port} must differ from port={self.port}")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas={self.min_insync_replicas} must not exceed "
                f"replication_factor={self.replication_factor}: no write could ever be acknowledged"
            )
        return self

    # Layout ------------------------------------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def jars_root(self) -> Path:
        return self.lib_dir if self.lib_dir is not None else self.home / "lib"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def properties_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.home / "log4j.properties"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def listener_file(self) -> Path:
        """What the storage was formatted for: PLAINTEXT (also when the file is missing, as before it existed) or
        SASL_SSL."""
        return self.home / "formatted-for"

    @property
    def keystore_file(self) -> Path:
        return self.home / "tls" / "broker-keystore.pem"

    @property
    def bootstrap(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def kafka_settings(self, topic_prefix: str | None = None) -> KafkaSettings:
        """Client settings for this broker, as its admin when it is secured. Security fields are pinned so
        ``PRECURSOR_KAFKA_*`` cannot leak in."""
        security = self.security
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=topic_prefix or self.topic_prefix,
            security_protocol=_CLIENT_LISTENER[security is not None],
            sasl_mechanism=None if security is None else _SCRAM_MECHANISM,
            sasl_plain_username=None if security is None else security.admin_username,
            sasl_plain_password=None if security is None else security.admin_password,
            ssl_cafile=None if security is None else str(security.ca_file),
            ssl_certfile=None,
            ssl_keyfile=None,
            ssl_password=None,
        )

    # Verbs -------------------------------------------------------------------------------------------------------

    def resolve_jars(self, report: Report | None = None) -> Path:
        """The folder of broker jars, resolved from Maven Central on first use and reused after that."""
        return resolve_runtime_jars(
            KAFKA_POM, self.jars_root, maven_executable=self.maven_executable, report=report or log.info
        )

    def up(self, timeout_s: float = 60.0, report: Report | None = None) -> BrokerStatus:
        """Start the broker unless ours already runs, wait until it answers, then create the project's topics."""
        say = report or log.info
        started_at = time.monotonic()
        deadline = started_at + timeout_s
        pid = self.start(say)
        self.wait_until_answering(pid, deadline)
        ensured = ensure_topics(
            self.kafka_settings(), Topics(self.topic_prefix).specs(self.partitions), timeout_s=timeout_s
        )
        if ensured.created:
            say(f"created {len(ensured.created)} topics: {', '.join(ensured.created)}")
        say(f"ready at {self.bootstrap} in {time.monotonic() - started_at:.1f} s (pid {pid})")
        return self.status()

    def start(self, report: Report | None = None) -> int:
        """Launch the broker unless ours already runs, without waiting for it; its pid. The nodes of a cluster all
        start before any can answer, since a KRaft quorum needs a majority of them."""
        say = report or log.info
        pid = self._running_pid()
        if pid is not None:
            running_at = self._running_bootstrap()
            if running_at != self.bootstrap:
                raise BrokerError(
                    f"the broker of {self.state_dir} already runs at {running_at}, not at {self.bootstrap}: "
                    "stop it (precursor kafka down) to change its ports"
                )
            say(f"broker already running (pid {pid}) at {self.bootstrap}")
            return pid
        java = self._java()
        self._refuse_busy_ports()
        self._refuse_other_listener()
        jars = self.resolve_jars(say)
        self._write_config()
        if not (self.data_dir / "meta.properties").exists():
            say(f"formatting KRaft storage in {self.data_dir}")
            self._format_storage(java, jars)
            self.listener_file.write_text(self.server_properties()["inter.broker.listener.name"])
        say(f"starting Kafka {kafka_version()} (heap {self.heap_mb} MiB, log {self.logs_dir / 'server.log'})")
        return self._launch(java, jars)

    def down(self, timeout_s: float = 30.0, report: Report | None = None) -> bool:
        """Stop our broker: SIGTERM, then SIGKILL after ``timeout_s``. False when ours was not running."""
        return self.service.stop(timeout_s, report or log.info, absent=f"no broker of {self.state_dir} is running")

    def status(self) -> BrokerStatus:
        """Our broker's state. A running broker reports the address it was started with, whatever the settings say."""
        pid = self._running_pid()
        bootstrap = self._running_bootstrap() if pid is not None else self.bootstrap
        settings = self.kafka_settings().model_copy(update={"bootstrap_servers": bootstrap})
        reachable = pid is not None and broker_reachable(settings, timeout_s=2.0)
        return BrokerStatus(
            running=pid is not None,
            reachable=reachable,
            pid=pid,
            bootstrap=bootstrap,
            state_dir=self.state_dir,
            topics=list_topics(settings) if reachable else [],
        )

    # Process ----------------------------------------------------------------------------------------------------

    def _java(self) -> str:
        return find_executable(
            self.java_executable,
            purpose="to run the local Kafka broker",
            install_hint="install a Java 17 runtime (e.g. `apt-get install openjdk-17-jre-headless`)",
            setting="PRECURSOR_LOCAL_KAFKA_JAVA_EXECUTABLE",
        )

    @property
    def service(self) -> BackgroundProcess:
        """The broker process, known by its pid file and its command line."""
        if self._service is None:
            self._service = BackgroundProcess(
                self.pid_file,
                is_ours=lambda cmdline: f" {_BROKER_MAIN} {self.properties_file}" in cmdline,
                name="broker",
                error=BrokerError,
            )
        return self._service

    def _running_pid(self) -> int | None:
        return self.service.running_pid()

    def _running_bootstrap(self) -> str:
        """The client address in the properties file the running broker was started with."""
        for line in self.properties_file.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "advertised.listeners":
                return value.strip().partition("://")[2]
        raise BrokerError(f"{self.properties_file} has no advertised.listeners line")

    def _refuse_busy_ports(self) -> None:
        for name, port in (("port", self.port), ("controller_port", self.controller_port)):
            if port_in_use(self.host, port):
                raise BrokerError(
                    f"{name}={port} on {self.host} is in use by another process (not the broker of {self.state_dir}):"
                    f" stop it, or choose another port (PRECURSOR_LOCAL_KAFKA_{name.upper()})"
                )

    def _refuse_other_listener(self) -> None:
        """A plaintext storage has no admin credential, and a secured one must not start open: either way, say so
        now instead of waiting for a broker that will never let us in."""
        if not (self.data_dir / "meta.properties").exists():
            return
        formatted = self.listener_file.read_text().strip() if self.listener_file.exists() else "PLAINTEXT"
        wanted = _CLIENT_LISTENER[self.security is not None]
        if formatted != wanted:
            raise BrokerError(
                f"the storage in {self.data_dir} was formatted for a {formatted} broker, not {wanted}: start this "
                "broker on another state folder (PRECURSOR_STATE_DIR), or remove that one to begin afresh"
            )

    def _jvm_command(self, java: str, jars: Path, main: str) -> list[str]:
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 128)}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.log4j_file}",
            f"-Dkafka.logs.dir={self.logs_dir}",
            "-cp",
            f"{jars}/*",
            main,
        ]

    def _format_storage(self, java: str, jars: Path) -> None:
        command = [
            *self._jvm_command(java, jars, _STORAGE_TOOL_MAIN),
            "format",
            "--config",
            str(self.properties_file),
            "--cluster-id",
            self.cluster_id or new_cluster_id(),
            "--ignore-formatted",
        ]
        credential = None if self.security is None else self.security.scram_credential()
        if credential is None:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        else:
            # The credential goes in a private argument file that the java launcher expands, not on the command
            # line, where any local user could read it (a salted SCRAM password logs in to this broker as well).
            argfile = self.home / "format.args"
            _write_private(argfile, "".join(f'"{arg}"\n' for arg in [*command[1:], "--add-scram", credential]))
            try:
                done = subprocess.run([java, f"@{argfile}"], capture_output=True, text=True, check=False)
            finally:
                argfile.unlink()
        if done.returncode != 0:
            output = f"{done.stdout}{done.stderr}"
            if credential is not None:
                output = output.replace(credential, "SCRAM-SHA-512=[**********]")
            raise BrokerError(f"formatting KRaft storage in {self.data_dir} failed ({done.returncode}):\n{output}")

    def _launch(self, java: str, jars: Path) -> int:
        return self.service.launch(
            [*self._jvm_command(java, jars, _BROKER_MAIN), str(self.properties_file)],
            output=self.logs_dir / "broker.out",
            cwd=self.home,
        )

    def wait_until_answering(self, pid: int, deadline: float) -> None:
        """Return once the broker answers metadata requests; stop it and raise if it exits or ``deadline`` passes."""
        settings = self.kafka_settings()
        self.service.wait_until_ready(
            pid,
            deadline,
            ready=lambda timeout_s: broker_reachable(settings, timeout_s=timeout_s),
            address=self.bootstrap,
            logs=[self.logs_dir / "server.log", self.logs_dir / "broker.out"],
        )

    # Configuration ------------------------------------------------------------------------------------------------

    def server_properties(self) -> dict[str, str]:
        """The broker configuration, written to ``server.properties`` on every start."""
        listener = _CLIENT_LISTENER[self.security is not None]
        controller_protocol = "PLAINTEXT" if self.security is None else "SSL"
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum_voters or f"{self.node_id}@{self.host}:{self.controller_port}",
            "listeners": f"{listener}://{self.bootstrap},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{listener}://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"CONTROLLER:{controller_protocol},{listener}:{listener}",
            **self._security_properties(),
            "log.dirs": str(self.data_dir),
            "num.partitions": str(self.partitions),
            "default.replication.factor": str(self.replication_factor),
            "min.insync.replicas": str(self.min_insync_replicas),
            "offsets.topic.replication.factor": str(self.replication_factor),
            # Few internal partitions: the first consumer group creates them all, and 50 (the default) costs seconds.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(self.replication_factor),
            "transaction.state.log.min.isr": str(self.min_insync_replicas),
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # A starting broker is unfenced on its next heartbeat: a shorter interval makes it ready sooner.
            "broker.heartbeat.interval.ms": "500",
            "auto.create.topics.enable": "false",
            # Sized for a laptop or a 2-core CI runner, not for a production cluster.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        }

    def _security_properties(self) -> dict[str, str]:
        security = self.security
        if security is None:
            return {}
        # The broker's own login on its SASL_SSL listener (inter-broker traffic). Kafka logs this value as [hidden].
        password = security.admin_password.get_secret_value().replace("\\", "\\\\").replace('"', '\\"')
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{security.admin_username}" password="{password}";'
        )
        return {
            "sasl.enabled.mechanisms": _SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": _SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{_SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(security.ca_file),
            # SCRAM credentials live in the metadata log, so the controller cannot use them: the broker proves
            # who it is to the controller with its certificate instead.
            "listener.name.controller.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{security.admin_username};{security.broker_principal()}",
        }

    def _write_config(self) -> None:
        for folder in (self.home, self.data_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        properties = "".join(f"{key}={_escape_property(value)}\n" for key, value in self.server_properties().items())
        # Private: with security on, it holds the broker's own password.
        header = "# Written by precursor on every start; edits are overwritten.\n"
        _write_private(self.properties_file, header + properties)
        if self.security is not None:
            self.keystore_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Kafka's PEM key store is one file: the private key, then the certificate chain.
            key = self.security.key_file.read_text()
            if "BEGIN PRIVATE KEY" not in key:
                raise BrokerError(
                    f"key_file={self.security.key_file} must be an unencrypted PKCS#8 key (BEGIN PRIVATE KEY), "
                    "which Kafka's PEM key store reads; convert it with `openssl pkcs8 -topk8 -nocrypt`"
                )
            _write_private(self.keystore_file, key.rstrip("\n") + "\n" + self.security.cert_file.read_text())
        self.log4j_file.write_text(
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.RollingFileAppender\n"
            f"log4j.appender.file.File={self.logs_dir / 'server.log'}\n"
            "log4j.appender.file.MaxFileSize=10MB\n"
            "log4j.appender.file.MaxBackupIndex=2\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka.request.logger=WARN\n"
            "log4j.logger.state.change.logger=WARN\n"
        )
