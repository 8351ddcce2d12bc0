"""A local Kafka cluster: several KRaft nodes on one machine, each a broker and a controller, topics replicated.

What a single :class:`~infra.kafka_broker.LocalKafka` cannot show: a broker dying while the others carry on. Every
node is a ``LocalKafka`` of its own (its own state folder, pid file and log) formatted with one shared cluster id and
voting in one controller quorum, so ``precursor kafka up --brokers 3`` gives three processes that survive the loss of
any one of them::

    <state>/kafka-cluster/cluster.id              the KRaft cluster id every node was formatted with
    <state>/kafka-cluster/node-<id>/kafka/...     one node: data, logs, server.properties, broker.pid

Topics are replicated to ``min(3, brokers)`` nodes with ``min.insync.replicas`` one less (at least 1), so an
``acks=all`` write is on two nodes before the edge counts it sent, and a node may die without losing it or stopping
writes. Jars are shared with the single broker's (``<state>/kafka/lib``).

>>> cluster = LocalKafkaCluster(state_dir="/tmp/precursor-state", brokers=3, first_port=19092)
>>> cluster.bootstrap
'127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096'
>>> cluster.quorum_voters
'1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097'
>>> (cluster.replication_factor, cluster.min_insync_replicas)
(3, 2)
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.kafka_admin import admin_client, ensure_topics, list_topics, topics_on_node
from infra.kafka_broker import BrokerError, LocalKafka, new_cluster_id
from infra.service_settings import AbsolutePath
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import Topics

log = logging.getLogger(__name__)

Report = Callable[[str], None]


class NodeStatus(BaseModel):
    node_id: int
    running: bool
    pid: int | None
    bootstrap: str


class PartitionReplicas(BaseModel):
    leader: int = Field(description="node id of the leader; -1 while none is elected")
    replicas: list[int]
    in_sync: list[int]


class ClusterStatus(BaseModel):
    """What ``precursor kafka status --brokers N`` shows."""

    bootstrap: str
    nodes: list[NodeStatus]
    reachable: bool = Field(description="the cluster answers metadata requests")
    topics: list[str] = Field(default_factory=list)

    @property
    def running(self) -> int:
        return sum(node.running for node in self.nodes)


_SHARED_BY_NODES = {"host", "partitions", "topic_prefix", "heap_mb"}
"""The cluster's settings that every node takes as they are, under the same names."""


class LocalKafkaCluster(BaseModel):
    """``brokers`` KRaft nodes on consecutive port pairs from ``first_port`` (client, then controller port)."""

    model_config = ConfigDict(extra="forbid")

    state_dir: AbsolutePath = Path(".state")
    brokers: int = Field(3, ge=2, le=9, description="nodes in the cluster (a quorum of 3 survives one loss)")
    host: str = "127.0.0.1"
    first_port: int = Field(9092, ge=1, le=65535 - 2 * 9)
    partitions: int = Field(6, ge=1)
    topic_prefix: str = Field("precursor", pattern=r"^[A-Za-z0-9._\-]+$")
    heap_mb: int = Field(384, ge=128, description="JVM heap ceiling per node")
    lib_dir: AbsolutePath | None = Field(
        None, description="where the broker jars are; <state_dir>/kafka/lib by default"
    )

    @property
    def home(self) -> Path:
        return self.state_dir / "kafka-cluster"

    @property
    def replication_factor(self) -> int:
        return min(3, self.brokers)

    @property
    def min_insync_replicas(self) -> int:
        return max(1, self.replication_factor - 1)

    def _ports(self, node_id: int) -> tuple[int, int]:
        port = self.first_port + 2 * (node_id - 1)
        return port, port + 1

    @property
    def quorum_voters(self) -> str:
        return ",".join(f"{i}@{self.host}:{self._ports(i)[1]}" for i in range(1, self.brokers + 1))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self._ports(i)[0]}" for i in range(1, self.brokers + 1))

    def cluster_id(self) -> str:
        """The id every node is formatted with: made once, kept beside the nodes."""
        path = self.home / "cluster.id"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            path.write_text(new_cluster_id())
        return path.read_text().strip()

    def node(self, node_id: int) -> LocalKafka:
        if not 1 <= node_id <= self.brokers:
            raise ValueError(f"node_id={node_id} is not one of this cluster's nodes 1..{self.brokers}")
        port, controller_port = self._ports(node_id)
        return LocalKafka(
            **self.model_dump(include=_SHARED_BY_NODES),
            state_dir=self.home / f"node-{node_id}",
            port=port,
            controller_port=controller_port,
            lib_dir=self.lib_dir or self.state_dir / "kafka" / "lib",
            node_id=node_id,
            quorum_voters=self.quorum_voters,
            cluster_id=self.cluster_id(),
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )

    def nodes(self) -> list[LocalKafka]:
        return [self.node(i) for i in range(1, self.brokers + 1)]

    def kafka_settings(self, topic_prefix: str | None = None) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.bootstrap, topic_prefix=topic_prefix or self.topic_prefix)

    def up(self, timeout_s: float = 120.0, report: Report | None = None) -> ClusterStatus:
        """Start every node that is not running, wait until all answer, then create the topics, replicated."""
        say = report or log.info
        started_at = time.monotonic()
        deadline = started_at + timeout_s
        nodes = self.nodes()
        nodes[0].resolve_jars(say)  # once, before the nodes would each ask Maven
        pids = [node.start(say) for node in nodes]
        for node, pid in zip(nodes, pids, strict=True):
            try:
                node.wait_until_answering(pid, deadline)
            except BrokerError:
                self.down(report=say)
                raise
        self._wait_for_every_broker(deadline)
        ensured = self.ensure_topics(self.kafka_settings(), timeout_s=max(10.0, deadline - time.monotonic()))
        if ensured:
            say(f"created {len(ensured)} topics, each on {self.replication_factor} nodes: {', '.join(ensured)}")
        say(f"{self.brokers} brokers ready at {self.bootstrap} in {time.monotonic() - started_at:.1f} s")
        return self.status()

    def _wait_for_every_broker(self, deadline: float) -> None:
        """Until the cluster's metadata lists every node. A node answers before the controller has registered it as a
        broker, and the metadata may already name it the controller: an admin request sent to it then fails with
        UnknownBrokerIdError (a cluster start failed so now and then)."""
        wanted = set(range(1, self.brokers + 1))
        while True:
            try:
                with admin_client(self.kafka_settings(), 5.0) as admin:
                    known = {int(b["broker_id"]) for b in admin.describe_cluster()["brokers"]}
            except Exception:  # a node still starting: ask again
                known = set()
            if wanted <= known:
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"the cluster's metadata lists brokers {sorted(known)}, not all of {sorted(wanted)}")
            time.sleep(0.2)

    def ensure_topics(self, settings: KafkaSettings, timeout_s: float = 30.0) -> list[str]:
        """The project's topics under ``settings``' prefix on this cluster, each replicated to
        :attr:`replication_factor` nodes (the nodes' default ``min.insync.replicas`` applies); the names created."""
        deadline = time.monotonic() + timeout_s
        specs = Topics(settings.topic_prefix).specs(self.partitions)
        ensured = ensure_topics(settings, specs, replication_factor=self.replication_factor, timeout_s=timeout_s)
        # Created through one node, known to the others a moment later: a client that asks another node first (the
        # edge checks its topics before it sends) must not be told they are missing. Each node is asked by its id:
        # a client bootstrapped from one node sends its requests to whichever node it likes.
        wanted = {spec.name for spec in specs}
        for node in self.nodes():
            if node.service.running_pid() is None:
                continue
            one = settings.model_copy(update={"bootstrap_servers": node.bootstrap})
            while not wanted <= topics_on_node(one, node.node_id, timeout_s=5.0):
                if time.monotonic() > deadline:
                    raise BrokerError(f"node {node.node_id} did not learn of the new topics in {timeout_s:.0f} s")
                time.sleep(0.1)
        return list(ensured.created)

    def down(self, timeout_s: float = 30.0, report: Report | None = None) -> int:
        """Stop every node this cluster started, all at once; how many were running.

        At once, because a node stopping cleanly hands its partitions over through the controller quorum: stopped one
        by one, the last node waits for a quorum that is gone and must be killed after ``timeout_s``."""
        nodes = self.nodes()
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            stopped = list(pool.map(lambda node: node.down(timeout_s, report), nodes))
        return sum(bool(s) for s in stopped)

    def kill(self, node_id: int) -> int:
        """SIGKILL one node, as a crash or a pulled plug would; its pid. For failure drills and tests."""
        node = self.node(node_id)
        pid = node.service.running_pid()
        if pid is None:
            raise BrokerError(f"node {node_id} of {self.home} is not running")
        os.kill(pid, signal.SIGKILL)
        while node.service.alive(pid):
            time.sleep(0.05)
        node.service.forget()
        return pid

    def replicas(self, topic: str, settings: KafkaSettings | None = None) -> dict[int, PartitionReplicas]:
        """Who leads and who is in sync, per partition of ``topic``, now."""
        with admin_client(settings or self.kafka_settings(), 10.0) as admin:
            (description,) = admin.describe_topics([topic])
        return {
            int(entry["partition_index"]): PartitionReplicas(
                leader=int(entry["leader_id"]),
                replicas=list(entry["replica_nodes"]),
                in_sync=list(entry["isr_nodes"]),
            )
            for entry in description["partitions"]
        }

    def status(self) -> ClusterStatus:
        nodes = []
        for node in self.nodes():
            pid = node.service.running_pid()
            nodes.append(NodeStatus(node_id=node.node_id, running=pid is not None, pid=pid, bootstrap=node.bootstrap))
        settings = self.kafka_settings()
        reachable = False
        topics: list[str] = []
        if any(n.running for n in nodes):
            try:
                topics = list_topics(settings, timeout_s=5.0)
                reachable = True
            except Exception:
                reachable = False
        return ClusterStatus(bootstrap=self.bootstrap, nodes=nodes, reachable=reachable, topics=topics)
