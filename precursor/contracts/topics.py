"""Kafka topic names and their layout. One place, so producers and consumers cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False


@dataclass(frozen=True)
class Topics:
    """Topic names under a prefix (``precursor`` by default), so several deployments can share a cluster.

    >>> Topics().predictions
    'precursor.predictions'
    >>> Topics("test-1").deadletter
    'test-1.deadletter'
    """

    prefix: str = "precursor"

    def _name(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    @property
    def predictions(self) -> str:
        return self._name("predictions")

    @property
    def events(self) -> str:
        return self._name("events")

    @property
    def heartbeats(self) -> str:
        return self._name("heartbeats")

    @property
    def model_updates(self) -> str:
        return self._name("model-updates")

    @property
    def alerts(self) -> str:
        return self._name("alerts")

    @property
    def deadletter(self) -> str:
        return self._name("deadletter")

    @property
    def telemetry(self) -> str:
        """Opt-in per-sensor summaries (:class:`~precursor.contracts.messages.TelemetrySummary`), keyed by machine_id;
        the raw
        readings stay at the edge."""
        return self._name("telemetry")

    def specs(self, partitions: int = 6) -> list[TopicSpec]:
        """Every topic with its partition count. Model updates are compacted: the latest release per key wins."""
        return [
            TopicSpec(self.predictions, partitions),
            TopicSpec(self.events, partitions),
            TopicSpec(self.heartbeats, 1),
            TopicSpec(self.model_updates, 1, compacted=True),
            TopicSpec(self.alerts, partitions),
            TopicSpec(self.deadletter, 1),
            TopicSpec(self.telemetry, partitions),
        ]
