"""Choosing the scorer an agent runs, and the slot that holds it: the running model and the one before it.

The agent's thread reads :attr:`ScorerSlot.current` once per batch of windows; the updater thread replaces it with
one assignment, so a batch is scored by one model from start to end, and a swap never blocks scoring.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.config import ModelSpec
from models.edge.baselines import DriftZScore
from models.edge.registry import ArtifactManifest, artifact_sha256, verify_artifact
from models.edge.releases import KEYRING_FILE, current_trust
from models.edge.scoring import Scorer
from models.edge.signing import load_public_keys

log = logging.getLogger("precursor.edge.model")


def load_trusted_keys(paths: Iterable[Path]) -> dict[str, Ed25519PublicKey]:
    """key_id -> public key, from ``.pub`` files and folders of them."""
    keys: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        keys.update(load_public_keys(path))
    return keys


@dataclass(frozen=True)
class RunningModel:
    """A scorer with where it came from: the artifact folder and the manifest hash (None for the baseline)."""

    scorer: Scorer
    artifact: Path | None = None
    sha256: str | None = None

    @property
    def label(self) -> str:
        return f"{self.scorer.name} {self.scorer.version}"


def load_lm(artifact: Path, spec: ModelSpec, trusted_keys: dict[str, Ed25519PublicKey]) -> RunningModel:
    """The signed language model artifact, verified before it is loaded."""
    return open_lm(artifact, spec, verify_artifact(artifact, trusted_keys))


def open_lm(artifact: Path, spec: ModelSpec, manifest: ArtifactManifest) -> RunningModel:
    """The language model artifact whose ``manifest`` the caller has just verified (see
    :meth:`models.edge.runtime.LMScorer.from_verified`)."""
    from models.edge.runtime import LMScorer  # onnxruntime is only needed when the LM runs

    scorer = LMScorer.from_verified(
        artifact, manifest, intra_op_num_threads=spec.threads, max_batch_size=spec.max_batch
    )
    return RunningModel(scorer, Path(artifact), artifact_sha256(artifact))


def load_scorer(spec: ModelSpec) -> Scorer:
    """The drift baseline, or the signed language model artifact the config names."""
    return load_configured(spec).scorer


def load_configured(spec: ModelSpec) -> RunningModel:
    if spec.type == "drift-zscore":
        return RunningModel(DriftZScore(horizon_h=spec.horizon.total_seconds() / 3600))
    assert spec.artifact is not None
    return load_lm(spec.artifact, spec, load_trusted_keys(spec.trusted_keys))


class ScorerSlot:
    """The running model, the previous one (for rollback), and a record of both in ``state_dir/models/current.json``
    so a restart runs what was running."""

    def __init__(self, running: RunningModel, state_file: Path | None = None) -> None:
        self.running = running
        self.previous: RunningModel | None = None
        self.state_file = state_file
        self._lock = threading.Lock()
        self.swaps = 0
        self.rollbacks = 0
        self.on_rollback: Callable[[RunningModel, str], None] | None = None
        """Told which model failed and why (the updater remembers not to take its release again)."""

    @property
    def current(self) -> Scorer:
        return self.running.scorer

    def swap(self, new: RunningModel) -> RunningModel:
        """Run ``new`` from now on; returns the model it replaced (kept as :attr:`previous`)."""
        with self._lock:
            old, self.running = self.running, new
            self.previous = old
            self.swaps += 1
            self._save()
        log.info(
            "model swapped: now %s (was %s)",
            new.label,
            old.label,
            extra={
                "model_version": new.scorer.version,
                "model_sha256": new.sha256,
                "previous_version": old.scorer.version,
            },
        )
        return old

    def rollback(self, reason: str) -> bool:
        """Back to the previous model; False if there is none."""
        with self._lock:
            if self.previous is None:
                return False
            failed, self.running, self.previous = self.running, self.previous, None
            self.rollbacks += 1
            self._save()
        if self.on_rollback is not None:
            self.on_rollback(failed, reason)
        log.error(
            "model %s rolled back to %s: %s",
            failed.label,
            self.running.label,
            reason,
            extra={"model_version": self.running.scorer.version, "failed_version": failed.scorer.version},
        )
        return True

    def _save(self) -> None:
        if self.state_file is None:
            return
        record = {
            "current": _describe(self.running),
            "previous": None if self.previous is None else _describe(self.previous),
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".current-", dir=self.state_file.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1)
        os.replace(temp, self.state_file)


def _describe(model: RunningModel) -> dict[str, str | None]:
    return {
        "name": model.scorer.name,
        "version": model.scorer.version,
        "artifact": None if model.artifact is None else str(model.artifact),
        "sha256": model.sha256,
    }


def load_running(spec: ModelSpec, state_file: Path) -> tuple[RunningModel, RunningModel | None]:
    """What ran before the restart (an updated model, verified again), else what the config names.

    Returns (running, previous); the previous is loaded too, so a rollback needs no disk or network.
    """
    configured: RunningModel | None = None
    if state_file.is_file() and spec.trusted_keys:
        # The keys the updater trusts now: an update signed by a rotated-in key loads, and a revoked key stays revoked.
        keys = current_trust(load_trusted_keys(spec.trusted_keys), state_file.parent / KEYRING_FILE).keys
        record = json.loads(state_file.read_text())
        loaded: list[RunningModel | None] = []
        for which in ("current", "previous"):
            entry = record.get(which)
            if not entry or not entry.get("artifact"):
                loaded.append(None)
                continue
            try:
                loaded.append(load_lm(Path(entry["artifact"]), spec, keys))
            except Exception as err:  # any failure (bad signature, broken file, ONNX error) means "do not run it"
                log.error("cannot load the %s model %s: %s", which, entry["artifact"], err)
                loaded.append(None)
        current, previous = loaded
        if current is not None:
            return current, previous
    configured = load_configured(spec)
    return configured, None
