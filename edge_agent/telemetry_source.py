"""What every telemetry source hands the agent: :class:`SourceBatch` es of items, behind :class:`TelemetrySource`.

The interface alone, apart from the sources themselves (:mod:`edge_agent.sources` for files and the simulator, and
the factory that picks one; :mod:`edge_agent.tail`; :mod:`edge_agent.mqtt`): a source implements it without importing
the others.

A source hands the agent batches of readings, events and unreadable records (never an exception for a bad record: a
:class:`~precursor.contracts.formats.RowError` the agent quarantines), with the source's *position* after the batch.
The agent
commits the position in the same transaction as everything the batch led to, then calls
:meth:`TelemetrySource.acknowledge` with the batch's ``ack``: that is where a source tells its upstream (an MQTT
broker) that the data is safe. On restart the agent passes the saved position back to :meth:`TelemetrySource.batches`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_agent.parsing import Reading
from precursor.contracts.formats import RowError
from precursor.contracts.messages import Event, TelemetryReading

Item = Reading | TelemetryReading | Event | RowError


@dataclass(slots=True)
class SourceBatch:
    """Items read together. ``position`` (JSON text) is saved with their effects; ``ack`` goes back to the source."""

    source: str
    items: list[Item]
    position: str | None = None
    ack: Any = None
    arrived: float = field(default_factory=time.monotonic)


class TelemetrySource(Protocol):
    name: str

    def attributes(self) -> dict[str, dict[str, str]]: ...

    def batches(self, position: str | None, stop: threading.Event) -> Iterator[SourceBatch]:
        """Batches from ``position`` (None: from the start) until the source ends or ``stop`` is set."""
        ...

    def acknowledge(self, ack: Any) -> None:
        """Everything up to the batch that carried ``ack`` is committed."""
        ...

    def close(self) -> None: ...
