"""Produce and consume Prediction messages through Kafka and print messages per second for each direction.

Uses the broker that ``PRECURSOR_KAFKA_*`` points at (``localhost:9092`` by default) when one answers; otherwise it
starts a local broker in a temporary state folder on free ports and stops it afterwards. Messages are encoded before
the clock starts, so the figures are the client and broker, not pydantic. Acks are ``all``, as the edge sends them.

    .venv/bin/python bench/kafka_throughput.py --messages 100000
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kafka
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from infra.kafka_admin import admin_client, broker_reachable, ensure_topics
from infra.kafka_broker import LocalKafka, kafka_version
from infra.processes import free_ports
from precursor.contracts.messages import Prediction, encode
from precursor.contracts.settings import KafkaSettings
from precursor.contracts.topics import TopicSpec

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rate:
    messages: int
    seconds: float
    payload_bytes: int

    def __str__(self) -> str:
        per_s = self.messages / self.seconds
        mib_per_s = self.payload_bytes / self.seconds / 2**20
        return f"{self.messages} msgs in {self.seconds:.2f} s = {per_s:,.0f} msg/s ({mib_per_s:.1f} MiB/s)"


def predictions(count: int) -> list[tuple[bytes, bytes]]:
    """``count`` (key, value) pairs: 1,000 machines on 50 edges, one window after another."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    pairs = []
    for seq in range(count):
        machine = f"pump-{seq % 1000:05d}"
        window_start = start + timedelta(minutes=10 * (seq // 1000))
        message = Prediction(
            edge_id=f"edge-{seq % 50:04d}",
            seq=seq,
            machine_id=machine,
            window_start=window_start,
            window_end=window_start + timedelta(hours=1),
            horizon_h=24,
            risk={"failure": (seq % 997) / 997, "bearing": (seq % 101) / 101, "seal": (seq % 13) / 13},
            model_name="telemetry-lm",
            model_version="2026.01.3",
        )
        pairs.append((machine.encode(), encode(message)))
    return pairs


@contextmanager
def reachable_broker(settings: KafkaSettings) -> Iterator[tuple[KafkaSettings, str]]:
    """The configured broker if it answers, else a temporary local one; yields settings and where they point."""
    if broker_reachable(settings, timeout_s=2):
        yield settings, f"existing broker at {settings.bootstrap_servers}"
        return
    started = time.perf_counter()
    with local_broker() as broker:
        origin = f"local Kafka {kafka_version()} started for this run in {time.perf_counter() - started:.1f} s"
        yield broker.kafka_settings(settings.topic_prefix), origin
        print(f"broker:  resident memory after the run {resident_mib(broker.status().pid)}")


@contextmanager
def local_broker(report: Callable[[str], None] = print) -> Iterator[LocalKafka]:
    """A broker of this run's own, up on free ports in a temporary folder with the jars the project already
    resolved; stopped and its folder removed at the end."""
    shared_state = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    with tempfile.TemporaryDirectory(prefix="precursor-bench-") as state_dir:
        port, controller_port = free_ports(2)
        broker = LocalKafka(
            state_dir=state_dir,
            port=port,
            controller_port=controller_port,
            lib_dir=LocalKafka(state_dir=shared_state).jars_root,
        )
        broker.up(timeout_s=120, report=report)
        try:
            yield broker
        finally:
            broker.down(report=report)


@contextmanager
def own_topics(prefix: str = "bench") -> Iterator[KafkaSettings]:
    """The project's topics under a prefix of this run's own (``prefix`` and a random tail), on a broker that answers
    (:func:`reachable_broker`); deleted again at the end, so a shared broker does not collect them."""
    with reachable_broker(KafkaSettings(topic_prefix=f"{prefix}{uuid.uuid4().hex[:6]}")) as (kafka, origin):
        print(f"broker:  {origin}")
        specs = kafka.topics.specs()
        ensure_topics(kafka, specs)
        try:
            yield kafka
        finally:
            with admin_client(kafka, timeout_s=10) as admin:
                admin.delete_topics([spec.name for spec in specs], raise_errors=False)


def resident_mib(pid: int | None) -> str:
    status = Path(f"/proc/{pid}/status")
    if pid is None or not status.exists():
        return "unknown"
    rss_kib = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmRSS:"))
    return f"{rss_kib / 1024:.0f} MiB"


def produce(settings: KafkaSettings, topic: str, pairs: list[tuple[bytes, bytes]]) -> Rate:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=5, batch_size=128 * 1024)
    started = time.perf_counter()
    for key, value in pairs:
        producer.send(topic, key=key, value=value)
    producer.flush()
    seconds = time.perf_counter() - started
    producer.close()
    return Rate(len(pairs), seconds, sum(len(value) for _, value in pairs))


def consume(settings: KafkaSettings, topic: str, partitions: int, expected: int) -> Rate:
    consumer = KafkaConsumer(
        **settings.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=5000
    )
    consumer.assign([TopicPartition(topic, partition) for partition in range(partitions)])
    received = payload = 0
    started = time.perf_counter()
    deadline = started + 300
    while received < expected and time.perf_counter() < deadline:
        for records in consumer.poll(timeout_ms=1000).values():
            received += len(records)
            payload += sum(len(record.value) for record in records)
    seconds = time.perf_counter() - started
    consumer.close()
    if received < expected:
        raise RuntimeError(f"consumed {received} of {expected} messages from {topic} before the 300 s deadline")
    return Rate(received, seconds, payload)


def cpu_name() -> str:
    """The processor's model name, for the line that says where a benchmark ran."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_line() -> str:
    return (
        f"{platform.node()}: {cpu_name()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, kafka-python {kafka.__version__}"
    )


def run(argv: list[str] | None = None, settings: KafkaSettings | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="how many messages to send and read back")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the benchmark topic")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.partitions < 1:
        parser.error(f"--messages={args.messages} and --partitions={args.partitions} must both be at least 1")

    print(f"date:    {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"machine: {machine_line()}")
    pairs = predictions(args.messages)
    mean_size = sum(len(value) for _, value in pairs) / len(pairs)
    print(f"payload: {len(pairs)} Prediction messages, {mean_size:.0f} bytes each on average, acks=all")

    configured = settings or KafkaSettings(topic_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    with reachable_broker(configured) as (target, origin):
        print(f"broker:  {origin}")
        topic = f"{target.topic_prefix}.predictions"
        ensure_topics(target, [TopicSpec(topic, args.partitions)])
        try:
            print(f"produce: {produce(target, topic, pairs)}")
            print(f"consume: {consume(target, topic, args.partitions, len(pairs))}")
        finally:
            with admin_client(target, timeout_s=10) as admin:
                admin.delete_topics([topic], raise_errors=False)


if __name__ == "__main__":
    run()
