"""Topic setup and reachability checks that work against any Kafka cluster, local or remote, TLS and SASL included.

Everything takes a :class:`~precursor.contracts.settings.KafkaSettings`, so the same call that prepares the local
broker prepares
a production cluster once the settings point there.

>>> split_host_port("k1:9093"), split_host_port("[::1]:9092"), split_host_port("broker")
(('k1', 9093), ('::1', 9092), ('broker', 9092))
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    KafkaAdminClient,
    OffsetSpec,
    ResourcePattern,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NotControllerError,
    NotCoordinatorError,
    TopicAlreadyExistsError,
    UnknownBrokerIdError,
    for_code,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.structs import OffsetAndMetadata, TopicPartition
from pydantic import SecretStr

from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import Topics, TopicSpec

DEFAULT_KAFKA_PORT = 9092
T = TypeVar("T")
log = logging.getLogger(__name__)


class TopicSetupError(RuntimeError):
    """The cluster refused to create a topic; the message names the topic and the broker's reason."""


class KafkaAccessError(ConnectionError):
    """A client could not get in: TLS refused, login refused, or nothing answering. The message says which."""


class AccessSetupError(RuntimeError):
    """The cluster refused a user's credential or an ACL; the message names which and the broker's reason."""


@dataclass(frozen=True)
class TopicsEnsured:
    """What :func:`ensure_topics` did: topics it created and topics that were already there (left as they were)."""

    created: tuple[str, ...]
    existing: tuple[str, ...]


def split_host_port(server: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``, or a bare host on the default port) as a pair."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else DEFAULT_KAFKA_PORT
    host, sep, port = server.rpartition(":")
    if not sep:
        return server, DEFAULT_KAFKA_PORT
    if not port.isdigit():
        raise ValueError(f"bootstrap server {server!r}: port {port!r} is not a number")
    return host, int(port)


class BrokerUnreachable(ConnectionError):
    """No bootstrap server accepts a connection; the message names each server and why, and how to start one."""


def check_reachable(servers: Sequence[str], timeout_s: float = 3.0) -> str:
    """Fail fast with a clear message: a kafka-python client with no broker blocks ~30 s before it says so.

    A plain TCP connect to each server in turn, ``timeout_s`` in all; the first that accepts is enough (and is
    returned). The edge
    publisher, the pipeline command and the API's live tail all ask here, so they agree on what "reachable" means.
    """
    deadline = time.monotonic() + timeout_s
    errors = []
    for server in servers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            errors.append(f"{server}: not tried, {timeout_s:g} s spent")
            continue
        try:
            with socket.create_connection(split_host_port(server), timeout=remaining):
                return server
        except (OSError, ValueError) as err:
            errors.append(f"{server}: {err}")
    raise BrokerUnreachable(
        "no Kafka broker reachable at " + ", ".join(servers) + f" ({'; '.join(errors)}). "
        "Start the local one with `precursor kafka up`, or set PRECURSOR_KAFKA_BOOTSTRAP_SERVERS."
    )


def _any_port_open(servers: Sequence[str], deadline: float) -> bool:
    try:
        check_reachable(servers, deadline - time.monotonic())
    except BrokerUnreachable:
        return False
    return True


@contextmanager
def admin_client(settings: KafkaSettings, timeout_s: float | None = None) -> Iterator[KafkaAdminClient]:
    """A connected admin client that is closed on exit. ``timeout_s`` bounds the bootstrap and each request."""
    kwargs = settings.client_kwargs()
    if timeout_s is not None:
        timeout_ms = max(1, int(timeout_s * 1000))
        kwargs["bootstrap_timeout_ms"] = timeout_ms
        kwargs["request_timeout_ms"] = min(kwargs["request_timeout_ms"], timeout_ms)
    admin = KafkaAdminClient(**kwargs)
    try:
        yield admin
    finally:
        admin.close()


def broker_reachable(settings: KafkaSettings, timeout_s: float = 2.0) -> bool:
    """Whether a broker answers a metadata request within ``timeout_s``.

    A plain socket connect comes first: it fails in milliseconds when nothing listens, where a client would retry
    for its whole bootstrap timeout.
    """
    deadline = time.monotonic() + timeout_s
    if not _any_port_open(settings.servers, deadline):
        return False
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    try:
        with admin_client(settings, remaining) as admin:
            admin.list_topics()
    except (KafkaError, OSError):
        return False
    return True


class _BootstrapFailures(logging.Handler):
    """kafka-python retries a refused login or TLS handshake until its bootstrap deadline and then raises only
    ``Unable to bootstrap``; the reason of each attempt is in its warnings, so these are kept to name it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Bootstrap connection to") and isinstance(record.args, tuple) and record.args[1:]:
            self.reasons.append(str(record.args[1]))
            return
        # Which of kafka-python's loggers says it depends on the phase and the timing (transport, connection or
        # manager), so any of them naming a refusal counts.
        text = record.getMessage()
        if any(marker in text for marker in _REFUSALS):
            self.reasons.append(text)


# "socket disconnected" names nothing by itself, but says the broker closed on us: check_access then finds out which
# phase failed (kafka-python may drop the broker's last answer, a login refusal, when the close comes in the same read).
_REFUSALS = ("SaslAuthenticationFailed", "invalid credentials", "CERTIFICATE_VERIFY_FAILED", "socket disconnected")


def _tls_handshake(settings: KafkaSettings, timeout_s: float) -> str | None:
    """Why a TLS handshake with the first bootstrap server fails under ``settings``, or None when it succeeds."""
    context = ssl.create_default_context(cafile=settings.ssl_cafile)
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_certfile:
        password = settings.ssl_password.get_secret_value() if settings.ssl_password else None
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile, password)
    host, port = split_host_port(settings.servers[0])
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except (ssl.SSLError, OSError) as err:
        return f"TLS handshake failed: {err}"


def _why_closed(settings: KafkaSettings, timeout_s: float) -> str:
    """A name for "the broker closed the connection": kafka-python may drop the broker's last answer (a login
    refusal) when the close arrives in the same read, so the phase that failed is found out here instead."""
    protocol = settings.security_protocol
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        return f"the broker closed the connection unanswered: does its listener expect TLS, not {protocol}?"
    refused_tls = _tls_handshake(settings, timeout_s)
    if refused_tls is not None:
        return refused_tls
    if protocol == "SASL_SSL":
        return (
            f"TLS succeeded, then the broker closed the connection during the SASL {settings.sasl_mechanism} login "
            f"as {settings.sasl_plain_username}: a wrong password, an unknown user, or a mechanism it does not enable"
        )
    return "TLS succeeded, then the broker closed the connection: does it expect SASL or a client certificate?"


def check_access(settings: KafkaSettings, timeout_s: float = 5.0) -> None:
    """Log in as ``settings`` say and fetch the cluster's metadata; raise :class:`KafkaAccessError` naming why not.

    For the reasons a client alone cannot mend (a certificate its CA file does not vouch for, a wrong password, a
    plaintext client at a TLS listener) kafka-python only says it could not bootstrap; this says what went wrong.
    """
    if not _any_port_open(settings.servers, time.monotonic() + timeout_s):
        raise KafkaAccessError(f"nothing accepts connections at {settings.bootstrap_servers}")
    failures = _BootstrapFailures()
    kafka_log = logging.getLogger("kafka")
    kafka_log.addHandler(failures)
    try:
        with admin_client(settings, timeout_s) as admin:
            admin.list_topics()
    except KafkaTimeoutError:
        named = [r for r in failures.reasons if "socket disconnected" not in r]
        if named:
            reason = named[-1]
        elif failures.reasons:
            reason = _why_closed(settings, timeout_s)
        else:
            reason = "no answer in time"
        who = f" as {settings.sasl_plain_username}" if settings.sasl_plain_username else ""
        raise KafkaAccessError(
            f"cannot use Kafka at {settings.bootstrap_servers} over {settings.security_protocol}{who}: {reason}"
        ) from None
    finally:
        kafka_log.removeHandler(failures)


def _check_specs(specs: list[TopicSpec]) -> None:
    by_name: dict[str, TopicSpec] = {}
    for spec in specs:
        if spec.partitions < 1:
            raise ValueError(f"topic {spec.name!r}: partitions={spec.partitions} must be at least 1")
        seen = by_name.setdefault(spec.name, spec)
        if seen != spec:
            raise ValueError(f"topic {spec.name!r} is listed twice with different layouts: {seen} and {spec}")


def ensure_topics(
    settings: KafkaSettings,
    specs: Iterable[TopicSpec],
    *,
    replication_factor: int | None = None,
    timeout_s: float = 30.0,
) -> TopicsEnsured:
    """Create every topic of ``specs`` that does not exist yet and wait until each has a leader.

    Existing topics are left as they are (an operator may have given them more partitions). Compacted specs get
    ``cleanup.policy=compact``. ``replication_factor=None`` takes the cluster's ``default.replication.factor``.
    """
    wanted = list(specs)
    _check_specs(wanted)
    if replication_factor is not None and replication_factor < 1:
        raise ValueError(f"replication_factor={replication_factor} must be at least 1 (or None for the default)")
    names = list(dict.fromkeys(spec.name for spec in wanted))
    created: list[str] = []
    # A cluster that has just started: the node asked may name a controller it has no address for yet
    # (UnknownBrokerIdError from kafka-python; `precursor kafka up --brokers 3` failed on it now and then, after every
    # node had answered and one node's metadata listed all three). Each attempt is a fresh client (fresh metadata).
    settled(
        lambda: _create_missing(settings, wanted, names, replication_factor, timeout_s, created),
        _CONTROLLER_SETTLING,
        timeout_s,
        "creating topics: the controller is not known yet",
    )
    return TopicsEnsured(
        created=tuple(name for name in names if name in created),
        existing=tuple(name for name in names if name not in created),
    )


_CONTROLLER_SETTLING = (UnknownBrokerIdError, NotControllerError, NodeNotReadyError)


def _create_missing(
    settings: KafkaSettings,
    wanted: list[TopicSpec],
    names: list[str],
    replication_factor: int | None,
    timeout_s: float,
    created: list[str],
) -> None:
    """One attempt of :func:`ensure_topics` with a fresh client (fresh metadata); appends the names it created."""
    with admin_client(settings, timeout_s) as admin:
        present = set(admin.list_topics())
        missing = {spec.name: spec for spec in wanted if spec.name not in present}
        if missing:
            request = {
                spec.name: {
                    "num_partitions": spec.partitions,
                    "replication_factor": replication_factor or -1,
                    "configs": {"cleanup.policy": "compact"} if spec.compacted else {},
                }
                for spec in missing.values()
            }
            response = admin.create_topics(request, timeout_ms=int(timeout_s * 1000), raise_errors=False)
            for result in response["topics"]:
                error = for_code(result["error_code"])
                if result["error_code"] == 0:
                    created.append(result["name"])
                elif error is not TopicAlreadyExistsError:  # created concurrently by someone else: fine
                    reason = result.get("error_message") or error.__name__
                    raise TopicSetupError(f"creating topic {result['name']!r} failed: {reason}")
        if names:
            admin.wait_for_topics(names, timeout_ms=int(timeout_s * 1000))


def list_topics(settings: KafkaSettings, timeout_s: float = 10.0) -> list[str]:
    """Names of the cluster's topics, internal ones (``__consumer_offsets``) left out, sorted."""
    with admin_client(settings, timeout_s) as admin:
        return sorted(name for name in admin.list_topics() if not name.startswith("__"))


def topics_on_node(settings: KafkaSettings, node_id: int, timeout_s: float = 5.0) -> set[str]:
    """The topic names one node of the cluster reports, from its own metadata cache.

    The admin client's ``list_topics`` asks whichever node is least loaded, so it cannot show that a topic made a
    moment ago through one node is known to another yet. kafka-python (3.x) offers no public call to address a node,
    so this sends the metadata request through the admin client's connection manager, naming the node."""
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False)

    async def ask(admin: KafkaAdminClient) -> set[str]:
        response = await admin._manager.send(request, node_id=node_id)
        return {topic["name"] for topic in response.to_dict()["topics"] if topic["error_code"] == 0}

    with admin_client(settings, timeout_s) as admin:
        return admin._manager.run(ask, admin)


def missing_topics(settings: KafkaSettings, names: Iterable[str], timeout_s: float = 5.0) -> list[str]:
    """Which of ``names`` the cluster does not have, sorted (a producer would only log, again and again, that it
    cannot find them). Raises :class:`KafkaError` or :class:`OSError` when the cluster does not answer."""
    with admin_client(settings, timeout_s) as admin:
        present = set(admin.list_topics())
    return sorted(set(names) - present)


def add_scram_users(
    settings: KafkaSettings, users: Mapping[str, SecretStr], *, iterations: int = 8192, timeout_s: float = 30.0
) -> None:
    """Create (or change) SCRAM-SHA-512 users through the Admin API, as a super user.

    The client salts and hashes each password itself: what travels, even inside TLS, is the salted form.
    """
    upsertions = [
        UserScramCredentialUpsertion(name, ScramMechanism.SCRAM_SHA_512, password.get_secret_value(), iterations)
        for name, password in users.items()
    ]
    if not upsertions:
        return
    with admin_client(settings, timeout_s) as admin:
        refused = {user: reason for user, reason in admin.alter_user_scram_credentials(upsertions).items() if reason}
    if refused:
        raise AccessSetupError(
            "the cluster refused SCRAM credentials for " + "; ".join(f"{u}: {r}" for u, r in sorted(refused.items()))
        )


def edge_acls(topics: Topics, user: str, group: str) -> list[ACL]:
    """Everything one edge may do, and nothing more: write what an edge publishes under this prefix (predictions,
    events, heartbeats, telemetry) and read model releases, in its own consumer group. Alerts, the dead-letter
    topic, model releases (writing them) and every other prefix stay closed to it.

    >>> sorted((a.operation.name, a.resource_pattern.resource_name) for a in edge_acls(Topics("t"), "e1", "g1"))[:3]
    [('DESCRIBE', 't.events'), ('DESCRIBE', 't.heartbeats'), ('DESCRIBE', 't.model-updates')]
    """
    principal = f"User:{user}"

    def allow(operation: ACLOperation, kind: ResourceType, name: str) -> ACL:
        return ACL(principal, "*", operation, ACLPermissionType.ALLOW, ResourcePattern(kind, name))

    published = (topics.predictions, topics.events, topics.heartbeats, topics.telemetry)
    return [
        *(allow(op, ResourceType.TOPIC, t) for t in published for op in (ACLOperation.WRITE, ACLOperation.DESCRIBE)),
        allow(ACLOperation.READ, ResourceType.TOPIC, topics.model_updates),
        allow(ACLOperation.DESCRIBE, ResourceType.TOPIC, topics.model_updates),
        allow(ACLOperation.READ, ResourceType.GROUP, group),
    ]


def grant_acls(settings: KafkaSettings, acls: Iterable[ACL], *, timeout_s: float = 30.0) -> None:
    """Create ACLs (a super user's job). Granting one that exists already is not an error."""
    wanted = list(acls)
    if not wanted:
        return
    with admin_client(settings, timeout_s) as admin:
        result = admin.create_acls(wanted)
    if result["failed"]:
        raise AccessSetupError(f"the cluster refused {len(result['failed'])} ACLs: {result['failed']}")


def settled(call: Callable[[], T], transient: tuple[type[Exception], ...], timeout_s: float, waiting: str) -> T:
    """``call``, asked again every 0.2 s while it raises one of ``transient`` (a cluster still settling); past
    ``timeout_s`` the last error stands. ``waiting`` says in the log what is not ready yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except transient as err:
            if time.monotonic() > deadline:
                raise
            log.info("%s (%s); asking again", waiting, type(err).__name__)
            time.sleep(0.2)


# A fresh cluster creates its offsets topic on the first group request and answers "coordinator not available" until
# it has.
_COORDINATOR_SETTLING = (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError)


def _coordinated(call: Callable[[], T], timeout_s: float) -> T:
    return settled(call, _COORDINATOR_SETTLING, timeout_s, "the group coordinator is not ready yet")


@dataclass(frozen=True)
class TopicBacklog:
    """One topic as a consumer group sees it: what it holds, how far the group got, and how fast records arrive.

    ``lag`` counts records past the group's committed offsets (from the earliest retained record where the group
    committed none); ``produced`` counts records appended in the last ``window_s`` seconds, by broker timestamp.
    """

    topic: str
    partitions: int
    end: int
    committed: int
    lag: int
    produced: int
    window_s: float
    last_produced_at: datetime | None

    @property
    def produced_per_s(self) -> float:
        return self.produced / self.window_s if self.window_s > 0 else 0.0


def consumer_lag(
    settings: KafkaSettings,
    group: str,
    topics: Sequence[str],
    *,
    window_s: float = 60.0,
    now: datetime | None = None,
    timeout_s: float = 5.0,
    missing_ok: bool = False,
    at_least: Mapping[tuple[str, int], int] | None = None,
) -> list[TopicBacklog]:
    """Per topic: the group's lag and the records appended in the last ``window_s``, through one admin client.

    A topic the cluster lacks raises :class:`KafkaError` naming it, or with ``missing_ok`` is left out (an opt-in
    topic nobody created). ``at_least``: ``(topic, partition) -> offset`` the consumer is known to have reached
    elsewhere (a consumer whose group commits are a best-effort mirror of its own record).
    """
    now = now or datetime.now(UTC)
    since_ms = int(now.timestamp() * 1000 - window_s * 1000)
    with admin_client(settings, timeout_s) as admin:
        described = admin.describe_topics(list(topics))
        partitions: dict[str, list[TopicPartition]] = {}
        for entry in described:
            name = entry["name"]
            if not entry.get("error_code"):
                partitions[name] = [TopicPartition(name, p["partition_index"]) for p in entry["partitions"]]
        missing = [t for t in topics if not partitions.get(t)]
        if missing and not missing_ok:
            raise KafkaError(f"no topic {', '.join(missing)} on {settings.bootstrap_servers}")
        topics = [t for t in topics if t not in missing]
        tps = [tp for t in topics for tp in partitions[t]]
        if not tps:
            return []
        latest = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
        earliest = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.EARLIEST))
        newest = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.MAX_TIMESTAMP))
        recent = admin.list_partition_offsets(dict.fromkeys(tps, since_ms))
        committed = _coordinated(lambda: admin.list_group_offsets({group: tps}).get(group, {}), timeout_s)
    out = []
    for topic in topics:
        end = done = lag = produced = 0
        last_ms = -1
        for tp in partitions[topic]:
            tail, head = latest[tp].offset, earliest[tp].offset
            mark = committed.get(tp)
            position = mark.offset if mark is not None and mark.offset >= 0 else head
            position = max(position, (at_least or {}).get((tp.topic, tp.partition), 0))
            since = recent[tp].offset
            end += tail
            done += min(max(position, head), tail)
            lag += max(0, tail - max(position, head))
            produced += 0 if since < 0 else max(0, tail - since)  # -1: nothing at or after the window's start
            if newest[tp].offset >= 0:
                last_ms = max(last_ms, newest[tp].timestamp)
        out.append(
            TopicBacklog(
                topic=topic,
                partitions=len(partitions[topic]),
                end=end,
                committed=done,
                lag=lag,
                produced=produced,
                window_s=window_s,
                last_produced_at=None if last_ms < 0 else datetime.fromtimestamp(last_ms / 1000, UTC),
            )
        )
    return out


def commit_group_offsets(
    settings: KafkaSettings, group: str, offsets: Mapping[tuple[str, int], int], *, timeout_s: float = 10.0
) -> None:
    """Record ``(topic, partition) -> next offset`` as ``group``'s committed offsets, so Kafka's own tools (and
    :func:`consumer_lag`) see how far a consumer that keeps its offsets elsewhere got. The group must have no active
    members: a consumer that commits this way reads without joining it."""
    if not offsets:
        return
    request = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
    with admin_client(settings, timeout_s) as admin:
        result = _coordinated(lambda: admin.alter_group_offsets(group, request), timeout_s)
    failed = {tp: error for tp, error in result.items() if error is not None and error.__name__ != "NoError"}
    if failed:
        raise KafkaError(
            f"group {group!r}: committing offsets failed for "
            + ", ".join(f"{tp.topic}[{tp.partition}]: {error.__name__}" for tp, error in sorted(failed.items()))
        )
