"""Model updates over the air: follow ``<prefix>.model-updates``, and run a new model only once it proved itself.

For each :class:`~contracts.messages.ModelRelease` meant for this edge (its ``target`` is one of the edge's update
targets, and ``canary_edges``, when set, names this edge):

1. fetch the artifact its ``artifact_uri`` names (``file://`` folder or packed archive, or ``http(s)://`` archive),
   bounded by ``updates.max_bytes``, into a staging folder;
2. verify it against the release: the manifest's sha256 is the release's, the ed25519 signature is by a key in the
   config's ``trusted_keys``, every file matches the manifest (:func:`models.registry.verify_release`);
3. load it beside the running model;
4. self-test it on the agent's recent windows: it scores them without error, every risk is a probability, it reads
   enough of the sensors this edge has, and it is fast enough;
5. swap it in atomically, keeping the old one for rollback, and send a heartbeat with the new version.

Anything that fails is refused with a logged reason (and remembered, so the same release is not tried again), and
the old model keeps serving. A model that later fails while scoring is rolled back by the agent.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from contracts.messages import ContractError, ModelRelease, decode
from edge_agent.config import EdgeConfig, SelfTestSpec
from edge_agent.scorers import RunningModel, ScorerSlot, load_lm, load_trusted_keys
from models.registry import ArtifactError, unpack, verify_release
from models.scoring import ANY_FAILURE, Scorer, Window
from models.signing import SignatureError

log = logging.getLogger("precursor.edge.updates")

REFUSED_FILE = "refused.json"


class UpdateRefused(Exception):
    """A release the edge will not run; the text says why."""


@dataclass(frozen=True)
class UpdateOutcome:
    release: ModelRelease
    applied: bool
    reason: str
    seconds: float


def self_test(scorer: Scorer, windows: Sequence[Window], *, sensors: Sequence[str] | None, spec: SelfTestSpec) -> None:
    """Raise :class:`UpdateRefused` unless ``scorer`` handles ``windows`` the way a running model must."""
    min_coverage, max_ms = spec.min_sensor_coverage, spec.max_ms_per_window
    if sensors:
        seen = {name for w in windows for name in w.sensors}
        covered = [s for s in sensors if s in seen]
        coverage = len(covered) / len(sensors)
        if coverage < min_coverage:
            raise UpdateRefused(
                f"self-test: the model reads {len(sensors)} sensors ({', '.join(sorted(sensors)[:8])}...) and the "
                f"recent windows carry {len(covered)} of them ({coverage:.0%} < min_sensor_coverage "
                f"{min_coverage:.0%})"
            )
    started = time.perf_counter()
    try:
        risks = scorer.score_many(list(windows))
    except Exception as err:  # whatever a broken model raises, it must not run here
        raise UpdateRefused(
            f"self-test: scoring {len(windows)} recent windows raised {type(err).__name__}: {err}"
        ) from None
    ms_per_window = (time.perf_counter() - started) * 1000 / max(1, len(windows))
    if len(risks) != len(windows):
        raise UpdateRefused(f"self-test: {len(windows)} windows scored but {len(risks)} risks returned")
    for window, risk in zip(windows, risks, strict=True):
        if ANY_FAILURE not in risk:
            raise UpdateRefused(f"self-test: the risk for {window.machine_id} has no {ANY_FAILURE!r} key: {risk}")
        bad = {k: v for k, v in risk.items() if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= 1)}
        if bad:
            raise UpdateRefused(f"self-test: risk for {window.machine_id} is not a probability: {bad}")
    if ms_per_window > max_ms:
        raise UpdateRefused(f"self-test: {ms_per_window:.1f} ms per window, over max_ms_per_window {max_ms:g}")


def probe_windows(sensors: Sequence[str], count: int = 4) -> list[Window]:
    """Stand-in windows (flat readings of the model's own sensors) for when the agent has seen no window yet."""
    end = int(time.time()) // 3600 * 3600
    stamps = np.arange(end - 3600, end, 300, dtype=np.int64)
    names = tuple(sorted(sensors)) or ("value",)
    return [
        Window(
            machine_id=f"self-test-{i}",
            start=datetime.fromtimestamp(end - 3600, UTC),
            end=datetime.fromtimestamp(end, UTC),
            timestamps=stamps,
            sensors=names,
            values=np.full((len(stamps), len(names)), float(i), dtype=np.float32),
        )
        for i in range(count)
    ]


def model_sensors(artifact: Path) -> list[str] | None:
    """The sensors the artifact's telemetry tokenizer reads; None when it has no such tokenizer."""
    try:
        from models.tokenizer import TelemetryTokenizer, TokenizerError

        return list(TelemetryTokenizer.load(artifact).sensors)
    except (TokenizerError, OSError, ValueError):
        return None


class ModelUpdater:
    """Applies releases to a :class:`ScorerSlot`; the thread that follows Kafka calls :meth:`apply`."""

    def __init__(
        self,
        config: EdgeConfig,
        slot: ScorerSlot,
        recent_windows: Callable[[], list[Window]],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.slot = slot
        self.recent_windows = recent_windows
        self.on_change = on_change
        self.models_dir = config.state_dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.trusted_keys = load_trusted_keys(config.model.trusted_keys)
        self.refused: dict[str, str] = self._load_refused()
        self._lock = threading.Lock()
        self.applied = 0
        self.last_refusal: str | None = None

    def _load_refused(self) -> dict[str, str]:
        path = self.models_dir / REFUSED_FILE
        try:
            return {str(k): str(v) for k, v in json.loads(path.read_text()).items()}
        except (FileNotFoundError, json.JSONDecodeError, AttributeError):
            return {}

    def model_failed(self, model: RunningModel, reason: str) -> None:
        """A model that was running failed (and was rolled back): its release is not to be taken again."""
        if model.sha256 is not None:
            self._remember(model.sha256, f"{model.label}: failed while running: {reason}")

    @staticmethod
    def release_key(release: ModelRelease) -> str:
        """What a refusal is remembered by: the artifact's hash and the signature that came with it (a forged
        release of a good artifact must not block the genuine one)."""
        return f"{release.sha256}:{release.key_id}:{release.signature}"

    def _remember_refusal(self, release: ModelRelease, reason: str) -> None:
        self._remember(self.release_key(release), f"{release.model_name} {release.version}: {reason}", reason)

    def _remember(self, sha256: str, description: str, reason: str | None = None) -> None:
        with self._lock:  # the updater's thread refuses releases, the agent's thread reports failed models
            self.refused[sha256] = reason or description
            self.last_refusal = description
            path = self.models_dir / REFUSED_FILE
            temp = path.with_suffix(".tmp")
            temp.write_text(json.dumps(self.refused, indent=1))
            temp.replace(path)

    def concerns_us(self, release: ModelRelease) -> str | None:
        """Why this edge skips the release, or None if it should apply it."""
        edge_id = self.config.edge_id
        if release.target not in self.config.updates.targets and release.target != edge_id:
            return f"target {release.target!r} is not one of this edge's ({', '.join(self.config.updates.targets)})"
        if release.canary_edges and edge_id not in release.canary_edges:
            return "a canary release for other edges"
        if release.sha256 == self.slot.running.sha256:
            return "already running"
        for key in (release.sha256, self.release_key(release)):  # a model that failed running, or this release
            if key in self.refused:
                return f"refused before: {self.refused[key]}"
        return None

    def apply(self, release: ModelRelease) -> UpdateOutcome:
        started = time.monotonic()
        skip = self.concerns_us(release)
        if skip is not None:
            log.debug("release %s %s skipped: %s", release.model_name, release.version, skip)
            return UpdateOutcome(release, False, skip, time.monotonic() - started)
        fields = {"model_name": release.model_name, "model_version": release.version, "model_sha256": release.sha256}
        log.info("model release %s %s: fetching and verifying", release.model_name, release.version, extra=fields)
        try:
            new = self._prepare(release)
            old = self.slot.swap(new)
        except UpdateRefused as err:
            reason = str(err)
            self._remember_refusal(release, reason)
            log.error(
                "model update refused, %s keeps serving: %s",
                self.slot.running.label,
                reason,
                extra={**fields, "reason": reason},
            )
            return UpdateOutcome(release, False, reason, time.monotonic() - started)
        self.applied += 1
        self._prune(keep={new.artifact, old.artifact})
        self.on_change()
        seconds = time.monotonic() - started
        log.info("model update applied in %.2f s", seconds, extra={**fields, "seconds": round(seconds, 3)})
        return UpdateOutcome(release, True, "applied", seconds)

    def _prepare(self, release: ModelRelease) -> RunningModel:
        if release.size_bytes > self.config.updates.max_bytes:
            raise UpdateRefused(
                f"size_bytes={release.size_bytes} is over updates.max_bytes={self.config.updates.max_bytes}"
            )
        final = self.models_dir / f"{release.model_name}-{release.version}-{release.sha256[:12]}"
        if not final.is_dir():
            staging = self._fetch(release)
            try:
                verify_release(release, staging, self.trusted_keys)
            except SignatureError as err:
                shutil.rmtree(staging, ignore_errors=True)
                raise UpdateRefused(f"signature check failed: {err}") from None
            except ArtifactError as err:
                shutil.rmtree(staging, ignore_errors=True)
                raise UpdateRefused(f"hash check failed: {err}") from None
            staging.rename(final)
        try:
            return self._load_and_test(release, final)
        except UpdateRefused:
            in_use = {m.artifact for m in (self.slot.running, self.slot.previous) if m is not None}
            if final not in in_use:
                shutil.rmtree(final, ignore_errors=True)
            raise

    def _load_and_test(self, release: ModelRelease, final: Path) -> RunningModel:
        try:
            verify_release(release, final, self.trusted_keys)
            new = load_lm(final, self.config.model, self.trusted_keys)
        except SignatureError as err:
            raise UpdateRefused(f"signature check failed: {err}") from None
        except ArtifactError as err:
            raise UpdateRefused(f"hash check failed: {err}") from None
        except Exception as err:  # an artifact that verifies but will not load (ONNX error, bad config)
            raise UpdateRefused(f"cannot load the model: {type(err).__name__}: {err}") from None
        if (new.scorer.name, new.scorer.version) != (release.model_name, release.version):
            raise UpdateRefused(
                f"the artifact is {new.scorer.name} {new.scorer.version}, the release says "
                f"{release.model_name} {release.version}"
            )
        sensors = model_sensors(final)
        windows = self.recent_windows() or probe_windows(sensors or ())
        self_test(new.scorer, windows, sensors=sensors, spec=self.config.updates.self_test)
        return new

    def _fetch(self, release: ModelRelease) -> Path:
        """The artifact, unpacked into a fresh staging folder under the models folder."""
        staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.models_dir))
        target = staging / "artifact"
        uri = urllib.parse.urlparse(release.artifact_uri)
        try:
            if uri.scheme in ("", "file"):
                source = Path(urllib.parse.unquote(uri.path if uri.scheme else release.artifact_uri))
                if source.is_dir():
                    shutil.copytree(source, target)
                elif source.is_file():
                    unpack(source, target, max_bytes=self.config.updates.max_bytes)
                else:
                    raise UpdateRefused(f"artifact_uri {release.artifact_uri}: no such file or folder")
            elif uri.scheme in ("http", "https"):
                archive = staging / "artifact.tar"
                self._download(release.artifact_uri, archive)
                unpack(archive, target, max_bytes=self.config.updates.max_bytes)
                archive.unlink()
            else:
                raise UpdateRefused(f"artifact_uri scheme {uri.scheme!r} is not supported (file, http, https)")
        except ArtifactError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise UpdateRefused(f"cannot unpack the artifact: {err}") from None
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise UpdateRefused(f"cannot fetch {release.artifact_uri}: {err}") from None
        except UpdateRefused:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        # The artifact goes one level up so that the staging folder itself is what gets renamed into place.
        for entry in target.iterdir():
            entry.rename(staging / entry.name)
        target.rmdir()
        return staging

    def _download(self, url: str, out: Path) -> None:
        limit = self.config.updates.max_bytes
        with urllib.request.urlopen(url, timeout=30) as response, out.open("wb") as fh:
            total = 0
            while chunk := response.read(1 << 16):
                total += len(chunk)
                if total > limit:
                    raise UpdateRefused(f"artifact at {url} is larger than updates.max_bytes={limit}")
                fh.write(chunk)

    def _prune(self, keep: set[Path | None]) -> None:
        """Only the running and the previous model stay on disk."""
        keep_names = {p.name for p in keep if p is not None}
        for entry in self.models_dir.iterdir():
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in keep_names:
                shutil.rmtree(entry, ignore_errors=True)


class UpdateFollower(threading.Thread):
    """Reads the model-updates topic from its beginning (it is compacted: the latest release per key) and applies
    each new release. Keeps retrying while the broker is away."""

    def __init__(self, config: EdgeConfig, updater: ModelUpdater, stop: threading.Event) -> None:
        super().__init__(name="model-updates", daemon=True)
        self.config = config
        self.updater = updater
        self.stop_event = stop
        self.releases_seen = 0

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        topic = self.config.kafka.topics.model_updates
        poll_ms = int(self.config.updates.poll.total_seconds() * 1000)
        backoff = 1.0
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = KafkaConsumer(
                    **self.config.kafka.client_kwargs(),
                    group_id=None,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                )
                partitions = consumer.partitions_for_topic(topic)
                if not partitions:
                    raise KafkaError(f"topic {topic} does not exist yet")
                assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
                consumer.assign(assigned)
                consumer.seek_to_beginning(*assigned)
                backoff = 1.0
                while not self.stop_event.is_set():
                    polled = consumer.poll(timeout_ms=poll_ms)
                    latest: dict[bytes | None, bytes] = {}
                    for records in polled.values():
                        for record in records:
                            latest[record.key] = record.value  # a compacted topic: only the last per key counts
                    for value in latest.values():
                        self._handle(value)
            except (KafkaError, OSError) as err:
                log.info("model updates: %s; retrying in %.0f s", err, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            finally:
                if consumer is not None:
                    consumer.close()

    def _handle(self, value: bytes | None) -> None:
        if value is None:
            return  # a tombstone
        self.releases_seen += 1
        try:
            release = decode(ModelRelease, value)
        except ContractError as err:
            log.error("model updates: a record that is not a ModelRelease was ignored: %s", err)
            return
        self.updater.apply(release)
