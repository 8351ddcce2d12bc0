"""The contracts every side of Precursor meets at: message schemas, topic names, settings and data formats.

This package depends on nothing else in Precursor, so the edge, the pipelines and the flows can all import it.
"""

from precursor.contracts.messages import (
    SCHEMA_VERSION,
    Alert,
    ContractError,
    DeadLetter,
    EdgeEvent,
    Event,
    Heartbeat,
    ModelRelease,
    Prediction,
    TelemetryReading,
    decode,
    encode,
)
from precursor.contracts.settings import KafkaSettings, PrecursorSettings
from precursor.contracts.topics import Topics

__all__ = [
    "SCHEMA_VERSION",
    "Alert",
    "ContractError",
    "DeadLetter",
    "EdgeEvent",
    "Event",
    "Heartbeat",
    "KafkaSettings",
    "ModelRelease",
    "PrecursorSettings",
    "Prediction",
    "TelemetryReading",
    "Topics",
    "decode",
    "encode",
]
