"""Topic setup and reachability checks that work against any Kafka cluster, local or remote, TLS and SASL included.

Everything takes a :class:`~contracts.settings.KafkaSettings`, so the same call that prepares the local broker prepares
a production cluster once the settings point there.

>>> split_host_port("k1:9093"), split_host_port("[::1]:9092"), split_host_port("broker")
(('k1', 9093), ('::1', 9092), ('broker', 9092))
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from contracts.settings import KafkaSettings
from contracts.topics import TopicSpec

DEFAULT_KAFKA_PORT = 9092


class TopicSetupError(RuntimeError):
    """The cluster refused to create a topic; the message names the topic and the broker's reason."""


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


def _any_port_open(servers: Iterable[str], deadline: float) -> bool:
    for server in servers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            with socket.create_connection(split_host_port(server), timeout=remaining):
                return True
        except OSError:
            continue
    return False


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
    with admin_client(settings, timeout_s) as admin:
        present = set(admin.list_topics())
        missing = {spec.name: spec for spec in wanted if spec.name not in present}
        created: list[str] = []
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
    return TopicsEnsured(
        created=tuple(name for name in names if name in created),
        existing=tuple(name for name in names if name not in created),
    )


def list_topics(settings: KafkaSettings, timeout_s: float = 10.0) -> list[str]:
    """Names of the cluster's topics, internal ones (``__consumer_offsets``) left out, sorted."""
    with admin_client(settings, timeout_s) as admin:
        return sorted(name for name in admin.list_topics() if not name.startswith("__"))
