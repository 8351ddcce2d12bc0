"""Which registry versions a rollout rejected, kept next to the registry's champion pointer.

A published version is immutable and its folder holds exactly the files its signed manifest lists, so a rejection
cannot be written inside it. It goes to ``<registry>/<model_name>/rejected.json`` instead
(``{"VERSION": {"reason": ..., "at": ...}}``), written like ``champion.json`` (atomically; on an object
store, one PUT).

>>> import tempfile
>>> from models.edge.registry import ModelRegistry
>>> registry = ModelRegistry(tempfile.mkdtemp(), trusted_keys={})
>>> mark_rejected(registry, "2026.1.2", "canary edge-1 reports version 2026.1.2 failing")
>>> rejected_versions(registry)["2026.1.2"]["reason"]
'canary edge-1 reports version 2026.1.2 failing'
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from models.edge.registry import ModelRegistry

REJECTED_FILE = "rejected.json"


def rejected_versions(registry: ModelRegistry) -> dict[str, dict[str, str]]:
    """Rejected version -> ``{"reason", "at"}``; empty when nothing was rejected."""
    raw = registry.read_pointer(REJECTED_FILE)
    if raw is None:
        return {}
    where = registry.location_of(REJECTED_FILE)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"rejections file {where} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"rejections file {where} should hold a JSON object, holds {type(data).__name__}")
    return data


def mark_rejected(registry: ModelRegistry, version: str, reason: str) -> None:
    """Record that ``version`` was rejected and why; readers never see a half-written file."""
    rejected = rejected_versions(registry)
    rejected[version] = {"reason": reason, "at": datetime.now(UTC).isoformat()}
    registry.write_pointer(REJECTED_FILE, json.dumps(rejected, indent=1, sort_keys=True).encode())
