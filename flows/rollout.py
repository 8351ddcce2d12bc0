"""Staged rollout of a model release: canary edges first, the fleet once their heartbeats show it healthy, else back.

1. Note where the heartbeat topic ends, then publish the candidate's :class:`ModelRelease` with ``canary_edges``
   (key = ``target``; the topic is compacted, so the latest release per target is what a starting edge reads).
   An edge applies a release whose ``canary_edges`` is empty or names it, and ignores the others.
2. Read heartbeats from that point on. A canary is healthy after ``healthy_heartbeats`` heartbeats that report the
   new version with health ``ok``; one that reports the new version ``failing`` fails the rollout at once.
3. All canaries healthy before the deadline: publish the same release to the whole fleet (``canary_edges`` empty).
   Otherwise publish the previous champion's release to the whole fleet (the rollback) and report the candidate
   rejected. With no canary edges configured, the release goes to the fleet directly.

The watch is a small state machine (:class:`CanaryWatch`) fed by any heartbeat source, so it is tested without a
broker; :class:`KafkaReleaseChannel` and :class:`KafkaHeartbeats` are the real thing.

>>> from datetime import UTC, datetime
>>> watch = CanaryWatch(version="2", canary_edges=["e1", "e2"], healthy_heartbeats=1)
>>> beat = lambda edge, version, health="ok": Heartbeat(edge_id=edge, seq=1, timestamp=datetime.now(UTC),
...     model_name="precursor-lm", model_version=version, health=health)
>>> watch.observe(beat("e1", "2")); watch.observe(beat("e2", "1")); watch.verdict
'pending'
>>> watch.observe(beat("e2", "2")); watch.verdict
'healthy'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Literal, Protocol

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pydantic import BaseModel, ConfigDict, Field

from precursor.contracts.messages import ContractError, Heartbeat, ModelRelease, decode, encode
from precursor.contracts.settings import KafkaSettings

log = logging.getLogger(__name__)

CanaryState = Literal["waiting", "healthy", "failing"]
WatchVerdict = Literal["pending", "healthy", "failing"]


class ReleaseChannel(Protocol):
    """Where releases are announced to the fleet."""

    def publish(self, release: ModelRelease) -> None: ...


class HeartbeatSource(Protocol):
    """Heartbeats sent since the source was opened, a batch at a time."""

    def poll(self, timeout_s: float) -> list[Heartbeat]: ...

    def close(self) -> None: ...


class CanaryWatch:
    """Which canaries run ``version`` healthily, from the heartbeats they send."""

    def __init__(self, version: str, canary_edges: Sequence[str], healthy_heartbeats: int = 2) -> None:
        if not canary_edges:
            raise ValueError("CanaryWatch needs at least one canary edge")
        if healthy_heartbeats < 1:
            raise ValueError(f"healthy_heartbeats={healthy_heartbeats} must be at least 1")
        self.version = version
        self.healthy_heartbeats = healthy_heartbeats
        self._ok: dict[str, int] = dict.fromkeys(canary_edges, 0)
        self._failing: set[str] = set()
        self.last_seen: dict[str, Heartbeat] = {}

    def observe(self, heartbeat: Heartbeat) -> None:
        edge = heartbeat.edge_id
        if edge not in self._ok:
            return
        self.last_seen[edge] = heartbeat
        if heartbeat.model_version != self.version:
            return  # still on the old model: not switched yet (or refused the new one; the deadline decides)
        if heartbeat.health == "failing":
            self._failing.add(edge)
        elif heartbeat.health == "ok":
            self._ok[edge] += 1

    def state(self, edge: str) -> CanaryState:
        if edge in self._failing:
            return "failing"
        return "healthy" if self._ok[edge] >= self.healthy_heartbeats else "waiting"

    @property
    def states(self) -> dict[str, CanaryState]:
        return {edge: self.state(edge) for edge in self._ok}

    @property
    def verdict(self) -> WatchVerdict:
        states = self.states.values()
        if "failing" in states:
            return "failing"
        return "healthy" if all(s == "healthy" for s in states) else "pending"

    def describe(self) -> str:
        parts = []
        for edge, state in self.states.items():
            seen = self.last_seen.get(edge)
            running = f"running {seen.model_version} ({seen.health})" if seen else "no heartbeat"
            parts.append(f"{edge}: {state}, {running}")
        return "; ".join(parts)


class PublishedRelease(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: str
    target: str
    canary_edges: list[str]
    purpose: Literal["canary", "fleet", "rollback"]


class RolloutReport(BaseModel):
    """What a rollout did: ``released`` to the fleet, ``rolled_back`` to the previous champion, or ``rejected``
    (the canaries failed and there was no previous release to go back to)."""

    model_config = ConfigDict(frozen=True)

    outcome: Literal["released", "rolled_back", "rejected"]
    version: str
    reason: str
    canaries: dict[str, CanaryState] = Field(default_factory=dict)
    published: list[PublishedRelease] = Field(default_factory=list)
    seconds: float = 0.0


def staged_rollout(
    candidate: ModelRelease,
    previous: ModelRelease | None,
    channel: ReleaseChannel,
    open_heartbeats: Callable[[], HeartbeatSource],
    *,
    canary_edges: Sequence[str],
    deadline_s: float,
    healthy_heartbeats: int = 2,
    poll_s: float = 1.0,
    report: Callable[[str], None] = log.info,
    sign: Callable[[ModelRelease], ModelRelease] | None = None,
) -> RolloutReport:
    """Roll ``candidate`` out in stages (see the module text); ``previous`` is the release to go back to.

    ``sign`` (a :class:`models.edge.releases.ReleaseSigner`) signs each release as it is published, after its targeting
    is set: edges refuse unsigned releases, so only a test's own fake edges do without it. The rollback is signed as
    one (``rollback``), the only way an edge goes back to a lower version.
    """
    started = time.monotonic()
    published: list[PublishedRelease] = []

    def publish(release: ModelRelease, purpose: Literal["canary", "fleet", "rollback"]) -> None:
        # Stamped now: an edge takes the newest release of its target, and a rollback must be newer than the canary.
        release = release.model_copy(update={"released_at": datetime.now(UTC), "rollback": purpose == "rollback"})
        if sign is not None:
            release = sign(release)
        channel.publish(release)
        published.append(
            PublishedRelease(
                version=release.version, target=release.target, canary_edges=list(release.canary_edges), purpose=purpose
            )
        )
        report(f"published {release.model_name} {release.version} to {release.target} ({purpose})")

    fleet_release = candidate.model_copy(update={"canary_edges": []})
    if not canary_edges:
        publish(fleet_release, "fleet")
        return RolloutReport(
            outcome="released",
            version=candidate.version,
            reason="no canary edges configured",
            published=published,
            seconds=time.monotonic() - started,
        )

    watch = CanaryWatch(candidate.version, canary_edges, healthy_heartbeats)
    heartbeats = open_heartbeats()  # opened before the release, so no early heartbeat is missed
    try:
        publish(candidate.model_copy(update={"canary_edges": list(canary_edges)}), "canary")
        deadline = started + deadline_s
        while watch.verdict == "pending" and time.monotonic() < deadline:
            for heartbeat in heartbeats.poll(min(poll_s, max(0.0, deadline - time.monotonic()))):
                watch.observe(heartbeat)
    finally:
        heartbeats.close()

    if watch.verdict == "healthy":
        publish(fleet_release, "fleet")
        return RolloutReport(
            outcome="released",
            version=candidate.version,
            reason=f"canaries healthy: {watch.describe()}",
            canaries=watch.states,
            published=published,
            seconds=time.monotonic() - started,
        )
    why = "a canary failed" if watch.verdict == "failing" else f"canaries not healthy within {deadline_s:g} s"
    reason = f"{why}: {watch.describe()}"
    if previous is None:
        report(f"rollout of {candidate.version} stopped, nothing to roll back to: {reason}")
        return RolloutReport(
            outcome="rejected",
            version=candidate.version,
            reason=reason,
            canaries=watch.states,
            published=published,
            seconds=time.monotonic() - started,
        )
    publish(previous.model_copy(update={"canary_edges": [], "target": candidate.target}), "rollback")
    return RolloutReport(
        outcome="rolled_back",
        version=candidate.version,
        reason=reason,
        canaries=watch.states,
        published=published,
        seconds=time.monotonic() - started,
    )


# --- Kafka ---------------------------------------------------------------------------------------------------------


class KafkaReleaseChannel:
    """Publishes releases to ``<prefix>.model-updates`` keyed by target, with ``acks=all``; ``publish`` returns once
    the broker has the release."""

    def __init__(self, settings: KafkaSettings, timeout_s: float = 30.0) -> None:
        self.topic = settings.topics.model_updates
        self._timeout_s = timeout_s
        self._producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=0)

    def publish(self, release: ModelRelease) -> None:
        future = self._producer.send(self.topic, key=release.target.encode(), value=encode(release))
        self._producer.flush()
        future.get(timeout=self._timeout_s)

    def close(self) -> None:
        self._producer.close()


class KafkaHeartbeats:
    """Heartbeats appended to ``<prefix>.heartbeats`` after this object was created; invalid records are skipped."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.topic = settings.topics.heartbeats
        self._consumer = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False)
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            self._consumer.close()
            raise RuntimeError(f"topic {self.topic!r} does not exist on {settings.bootstrap_servers}")
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        for tp, end in self._consumer.end_offsets(tps).items():
            self._consumer.seek(tp, end)

    def poll(self, timeout_s: float) -> list[Heartbeat]:
        batches = self._consumer.poll(timeout_ms=int(max(0.0, timeout_s) * 1000), max_records=1000)
        heartbeats = []
        for records in batches.values():
            for record in records:
                try:
                    heartbeats.append(decode(Heartbeat, record.value or b""))
                except ContractError as err:
                    log.warning("skipping an invalid heartbeat at %s offset %d: %s", self.topic, record.offset, err)
        return heartbeats

    def close(self) -> None:
        self._consumer.close()
