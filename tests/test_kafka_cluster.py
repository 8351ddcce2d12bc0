"""A three-broker Kafka cluster: topics on three nodes, and a partition leader killed mid-stream loses nothing.

The cluster is started and stopped through the command line a user types (``precursor kafka up --brokers 3``). The
stream is the edge's own publisher (``acks=all``) into it and the ingest pipeline out of it into the store, run once
before the kill and once after: every prediction sent is stored exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import UnknownBrokerIdError

from edge_agent.publisher import KafkaPublisher
from infra.kafka_admin import admin_client, topics_on_node
from infra.kafka_cluster import LocalKafkaCluster
from infra.processes import free_ports
from pipelines.run import run_once
from precursor.contracts.messages import Prediction
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.conftest import shared_kafka_lib_dir
from tests.fixtures_messages import hourly_prediction

pytestmark = pytest.mark.integration

SENT = 600
KILL_AFTER = 200


def _precursor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "precursor", "kafka", *args], capture_output=True, text=True, timeout=240, check=False
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    state = tmp_path_factory.mktemp("cluster-state")
    first = free_ports(6, consecutive=True)[0]
    common = ("--brokers", "3", "--state-dir", str(state), "--port", str(first))
    lib = str(shared_kafka_lib_dir())
    started = subprocess.run(
        [sys.executable, "-m", "precursor", "kafka", "up", *common],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "PRECURSOR_LOCAL_KAFKA_LIB_DIR": lib},
    )
    cluster = LocalKafkaCluster(state_dir=state, brokers=3, first_port=first, lib_dir=lib)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"PRECURSOR_KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap}" in started.stdout
        yield cluster
    finally:
        stopped = _precursor("down", *common)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def _prediction(seq: int) -> Prediction:
    # 24 machines: every partition gets some
    return hourly_prediction(
        seq, edge_id="edge-cluster", seq=seq, machine_id=f"m-{seq % 24:02d}", risk={"failure": 0.1}
    )


def test_status_names_three_running_nodes(cluster: LocalKafkaCluster) -> None:
    shown = _precursor(
        "status", "--brokers", "3", "--state-dir", str(cluster.state_dir), "--port", str(cluster.first_port)
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "3 of 3 nodes" in shown.stdout
    assert all(f"node {i}" in shown.stdout for i in (1, 2, 3))


def test_topics_have_three_replicas_and_two_in_sync_required(cluster: LocalKafkaCluster) -> None:
    settings = cluster.kafka_settings()
    for topic in (settings.topics.predictions, settings.topics.events):
        assert all(sorted(p.replicas) == [1, 2, 3] for p in cluster.replicas(topic).values())
        with admin_client(settings, 10.0) as admin:
            configs = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"min.insync.replicas": None})],
                config_filter="all",
            )
        assert configs["topic"][topic]["min.insync.replicas"]["value"] == "2", configs


def test_each_node_is_asked_for_its_topics_by_id(cluster: LocalKafkaCluster) -> None:
    """What `ensure_topics` waits on: each node's own view, not whichever node a client picks."""
    settings = cluster.kafka_settings().model_copy(update={"bootstrap_servers": cluster.node(1).bootstrap})
    wanted = {spec.name for spec in settings.topics.specs()}
    for node_id in (1, 2, 3):
        assert wanted <= topics_on_node(settings, node_id)
    with pytest.raises(UnknownBrokerIdError):
        topics_on_node(settings, 4)


def test_a_leader_killed_mid_stream_loses_and_doubles_nothing(cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    settings: KafkaSettings = cluster.kafka_settings(topic_prefix=f"c{uuid.uuid4().hex[:8]}")
    cluster.ensure_topics(settings)
    store = tmp_path / "store.duckdb"
    publisher = KafkaPublisher(settings)
    first_part, go_on = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            for seq in range(1, SENT + 1):
                publisher.send(_prediction(seq))
                if seq % 10 == 0:
                    publisher.flush()
                if seq == KILL_AFTER:
                    first_part.set()
                    go_on.wait(120)
            publisher.close()
        except BaseException as err:
            failures.append(err)
            first_part.set()

    sender = threading.Thread(target=produce)
    sender.start()
    assert first_part.wait(120)
    first = run_once(settings, store)  # commits offsets to the store, read back after the kill
    go_on.set()
    deadline = time.monotonic() + 60
    while publisher.sent < KILL_AFTER + 50 and sender.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    leader = cluster.replicas(settings.topics.predictions)[0].leader
    cluster.kill(leader)  # mid-stream: about a third of the predictions are still to be sent
    sender.join(180)
    assert not sender.is_alive() and not failures, failures
    assert publisher.sent == SENT

    in_sync = cluster.replicas(settings.topics.predictions)
    assert all(leader not in p.in_sync and p.leader != leader for p in in_sync.values()), in_sync
    second = run_once(settings, store)

    assert first.stored == KILL_AFTER
    assert first.stored + second.stored == SENT
    with connect(store, read_only=True) as con:
        count, distinct, low, high = con.execute(
            "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM predictions"
        ).fetchone()
    assert (count, distinct, low, high) == (SENT, SENT, 1, SENT)
