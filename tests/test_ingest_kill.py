"""Ingest killed at random moments during its store writes, then run again, on DuckDB and on PostgreSQL: every record
from the real broker ends stored exactly once (or dead-lettered, or dropped as a duplicate), none is missing, the
rerun reads only what no committed write had covered, the alerts are those of one clean run, and the store's offsets
end at the topics' ends.

The run that is killed is a child process (SIGKILL: no cleanup, no finally) that writes in many small transactions
and says after each one that it wrote, so the kill lands among the writes, after a random one and a random pause.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipelines.run import CONSUMER, run_once
from pipelines.run_log import ledger_stages
from precursor.contracts.messages import DeadLetter, decode, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import PredictionStore
from precursor.store.ledger import contains
from precursor.store.queries import reading
from tests.fixtures_api import simulated_fleet_messages

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]
pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys

import pipelines.alerts as alerts
import pipelines.ingest as ingest
from pipelines.run import run_once
from precursor.contracts.settings import KafkaSettings


class SmallWrites(ingest.WriteToStore):
    '''Many small transactions, each announced once committed, so the parent's kill lands among them.'''

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._batch_size = 16

    def _flush(self):
        pending = len(self._rows)
        super()._flush()
        if pending:
            print("wrote", pending, flush=True)


class SaidAlertState(alerts.WriteAlertState):
    def finish_bundle(self):
        pending = len(self._decided)
        super().finish_bundle()
        if pending:
            print("decided", pending, flush=True)


ingest.WriteToStore = SmallWrites
alerts.WriteAlertState = SaidAlertState
run_once(KafkaSettings.model_validate_json(sys.argv[1]), sys.argv[2])
print("done", flush=True)
"""

POISON = [b"{not json", b"", b'{"edge_id": "e1", "seq": -1}', b"\xff\xfe" * 40, b"[]"]
RESENT = 30  # predictions an edge sent twice


Key = tuple[str, int]


def produce(settings: KafkaSettings) -> dict[tuple[str, int, int], Key | None]:
    """The fleet's predictions (some twice) and events, with poison among them; what lies at each position: the
    record's (edge_id, seq), or None for poison."""
    _, predictions, events, _ = simulated_fleet_messages(machines=8, days=3)
    producer = KafkaProducer(**settings.client_kwargs(), acks="all")
    sent: list[tuple[Any, Key | None]] = []
    rng = random.Random(5)
    outgoing: list[tuple[str, bytes, bytes, Key | None]] = [
        (settings.topics.predictions, p.machine_id.encode(), encode(p), (p.edge_id, p.seq))
        for p in [*predictions, *rng.sample(predictions, RESENT)]
    ]
    outgoing += [(settings.topics.events, e.machine_id.encode(), encode(e), (e.edge_id, e.seq)) for e in events]
    for i, raw in enumerate(POISON):
        topic = settings.topics.predictions if i % 2 == 0 else settings.topics.events
        outgoing.insert(rng.randrange(len(outgoing)), (topic, f"m{i}".encode(), raw, None))
    for topic, key, value, identity in outgoing:
        sent.append((producer.send(topic, key=key, value=value), identity))
    producer.flush()
    producer.close()
    at: dict[tuple[str, int, int], Key | None] = {}
    for future, identity in sent:
        meta = future.get(timeout=30)
        at[(meta.topic, meta.partition, meta.offset)] = identity
    return at


def kill_during_writes(settings: KafkaSettings, store: Path | str, rng: random.Random, after: str) -> bool:
    """Run ingest in a child and SIGKILL it after a random one of its ``after`` lines (``wrote``: rows; ``decided``:
    alert state) and a random pause; whether it was killed before it finished."""
    target = rng.randint(1, 6) if after == "wrote" else 1
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, settings.model_dump_json(), str(store)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    writes, killed = 0, False
    try:
        for line in child.stdout:
            writes += line.startswith(after)
            if writes == target:
                time.sleep(rng.uniform(0, 0.05 if after == "wrote" else 0.3))
                child.send_signal(signal.SIGKILL)
                killed = True
                break
    finally:
        status = child.wait(timeout=120)
        child.stdout.close()
    return killed and status == -signal.SIGKILL


def settle(store: Path | str) -> None:
    """Wait until the server has ended the killed child's session. PostgreSQL finishes a dead client's last
    transaction (a COMMIT it had sent) on its own time, so reads taken before then could see the rows' table before
    that commit and the ledger after it; a DuckDB file's writer dies with the process."""
    if not isinstance(store, str):
        return
    deadline = time.monotonic() + 30
    while True:
        with reading(store) as r:
            others = r.rows(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )[0]["n"]
        if not others:
            return
        assert time.monotonic() < deadline, f"{others} sessions still open on the store 30 s after the kill"
        time.sleep(0.05)


def stored_keys(store: Path | str, table: str) -> list[Key]:
    with reading(store) as r:
        return [(str(x["edge_id"]), int(x["seq"])) for x in r.rows(f"SELECT edge_id, seq FROM {table}")]


def alert_state(store: Path | str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with reading(store) as r:
        alerts = r.rows(
            "SELECT machine_id, kind, state, ts, risk, model_version FROM alerts ORDER BY machine_id, kind, ts, state"
        )
        timelines = r.rows("SELECT machine_id, timeline::VARCHAR AS t FROM alert_timelines ORDER BY machine_id")
    return [tuple(a.values()) for a in alerts], [tuple(t.values()) for t in timelines]


def dead_letters(settings: KafkaSettings) -> Iterator[DeadLetter]:
    """Every dead letter on the topic, read to its end offsets (no waiting for silence)."""
    consumer = KafkaConsumer(**settings.client_kwargs(), enable_auto_commit=False)
    try:
        topic = settings.topics.deadletter
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    yield decode(DeadLetter, record.value)
    finally:
        consumer.close()


@pytest.mark.parametrize("seed", [3])
def test_ingest_killed_during_its_writes_stores_every_record_exactly_once_after_a_rerun(
    kafka_settings: KafkaSettings, new_store: NewStore, seed: int
) -> None:
    at = produce(kafka_settings)
    topics = (kafka_settings.topics.predictions, kafka_settings.topics.events)
    store = new_store("killed")
    rng = random.Random(seed)
    kills = 0
    # Among the row writes twice (the second run skips what the first committed), then after the alert state (that
    # one may finish first: a run killed after its last write, or one that completed, are both moments to survive).
    for after in ("wrote", "wrote", "decided"):
        killed = kill_during_writes(kafka_settings, store, rng, after)
        settle(store)
        kills += killed and after == "wrote"
        # What committed: each stored record's offsets with it. Every key stored was covered with at least one of
        # its copies, and every record the ledger covers is stored, or is a dropped duplicate whose kept copy is not
        # yet covered (its position commits on its own, maybe before the kept copy's row): the rerun reads that copy.
        for topic, table in zip(topics, ("predictions", "events"), strict=True):
            keys = set(stored_keys(store, table))
            covered = PredictionStore(store).consumed(CONSUMER, topic)
            copies: dict[Key, list[bool]] = {}
            for (t, p, o), k in at.items():
                if t == topic and k is not None:
                    copies.setdefault(k, []).append(contains(covered.get(p, []), o))
            lost = {k for k, done in copies.items() if all(done) and k not in keys}
            assert not lost, f"{topic}: covered but not stored: {sorted(lost)[:5]}"
            pending = {k for k, done in copies.items() if any(done) and k not in keys}
            assert all(len(copies[k]) > 1 for k in pending), f"{topic}: a lone copy covered but not stored"
            for key in keys:
                assert any(contains(covered.get(p, []), o) for (t, p, o), k in at.items() if t == topic and k == key), (
                    f"{topic}: {key} stored without its offset"
                )
    assert kills == 2, "a child finished before its kill: too few writes to land among"

    # The rerun reads only what no committed write (or dead letter, or dropped duplicate) had covered.
    stages = {t: ledger_stages(CONSUMER, alerted=t == topics[0]) for t in topics}
    consumed = {t: PredictionStore(store).consumed(CONSUMER, t, stages[t]) for t in topics}
    left = sum(1 for (t, p, o) in at if t in topics and not contains(consumed[t].get(p, []), o))
    # Stored but not yet decided by the alert rule: read again, and found stored.
    stored_only = PredictionStore(store).consumed(CONSUMER, topics[0])
    undecided = sum(
        1
        for (t, p, o) in at
        if t == topics[0] and contains(stored_only.get(p, []), o) and not contains(consumed[t].get(p, []), o)
    )
    before = {table: len(stored_keys(store, table)) for table in ("predictions", "events")}
    rerun = run_once(kafka_settings, store)
    assert rerun.read == left
    assert rerun.read == rerun.stored + rerun.already_stored + rerun.duplicates + rerun.dead_lettered
    unique = {
        table: {k for (t, _, _), k in at.items() if t == topic and k}
        for topic, table in zip(topics, before, strict=True)
    }
    assert rerun.stored == sum(len(unique[t]) - before[t] for t in before)
    # Found stored already: a prediction stored but not decided, or a resent copy whose twin was stored (and
    # covered) before the kill; never a record whose own write had committed.
    assert undecided <= rerun.already_stored <= undecided + RESENT

    for table in before:
        keys = stored_keys(store, table)
        assert sorted(keys) == sorted(unique[table]), table  # every record, each once
    # The store's offsets end at the topics' ends, the ledger folded away.
    consumer = KafkaConsumer(**kafka_settings.client_kwargs())
    for topic in topics:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        ends = {tp.partition: end for tp, end in consumer.end_offsets(partitions).items() if end}
        offsets = PredictionStore(store).offsets(CONSUMER, topic)
        assert {p: o for p, o in offsets.items() if o} == ends, (topic, offsets)
    consumer.close()
    with reading(store) as r:
        assert r.rows("SELECT count(*) AS n FROM consumed_ranges")[0]["n"] == 0
    assert run_once(kafka_settings, store).read == 0

    # Each poison record was dead-lettered (at least once: the topic is outside the store's transaction).
    poison = {(t, p, o) for (t, p, o), k in at.items() if k is None}
    letters = [(d.source_topic, d.partition, d.offset) for d in dead_letters(kafka_settings)]
    assert set(letters) == poison

    # The alerts are those of one run that was never killed.
    clean = new_store("clean")
    run_once(kafka_settings, clean)
    assert alert_state(store) == alert_state(clean)
    assert alert_state(clean)[0], "the fleet raised no alert: the comparison would prove nothing"
