"""The prediction store: where the pipelines write and where ``precursor query`` and the HTTP API read."""

from precursor.store.db import Offset, PredictionStore, StoreBusy, connect

__all__ = ["Offset", "PredictionStore", "StoreBusy", "connect"]
