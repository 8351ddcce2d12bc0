"""Which registry versions a rollout rejected, kept next to the registry's champion pointer.

A published version is immutable and its folder holds exactly the files its signed manifest lists, so a rejection
cannot be written inside it. It goes to ``<registry>/<model_name>/rejected.json`` instead
(``{"VERSION": {"reason": ..., "at": ...}}``), written atomically like ``champion.json``.

>>> import tempfile
>>> from models.registry import ModelRegistry
>>> registry = ModelRegistry(tempfile.mkdtemp(), trusted_keys={})
>>> mark_rejected(registry, "2026.1.2", "canary edge-1 reports version 2026.1.2 failing")
>>> rejected_versions(registry)["2026.1.2"]["reason"]
'canary edge-1 reports version 2026.1.2 failing'
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime

from models.registry import ModelRegistry

REJECTED_FILE = "rejected.json"


def rejected_versions(registry: ModelRegistry) -> dict[str, dict[str, str]]:
    """Rejected version -> ``{"reason", "at"}``; empty when nothing was rejected."""
    path = registry.model_dir / REJECTED_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"rejections file {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"rejections file {path} should hold a JSON object, holds {type(data).__name__}")
    return data


def mark_rejected(registry: ModelRegistry, version: str, reason: str) -> None:
    """Record that ``version`` was rejected and why; readers never see a half-written file."""
    rejected = rejected_versions(registry)
    rejected[version] = {"reason": reason, "at": datetime.now(UTC).isoformat()}
    registry.model_dir.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{REJECTED_FILE}.", dir=registry.model_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(rejected, f, indent=1, sort_keys=True)
    os.replace(temp, registry.model_dir / REJECTED_FILE)
