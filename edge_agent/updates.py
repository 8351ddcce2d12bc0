"""Model updates over the air: follow ``<prefix>.model-updates``, and run a new model only once it proved itself.

For each :class:`~precursor.contracts.messages.ModelRelease` meant for this edge (its ``target`` is one of the edge's
update
targets, and ``canary_edges``, when set, names this edge):

1. check the release message itself (:mod:`models.edge.releases`): follow the key rotations it carries, check its
   signature as a whole by a trusted key and that it has not expired, and that it does not go back on what this edge
   accepted for its target (an older issue, a lower version unless signed as a rollback, another artifact under an
   accepted version; the ledger survives restarts); a repeat of the accepted release is a logged no-op;
2. fetch the artifact its ``artifact_uri`` names (``file://`` folder or packed archive, ``http(s)://`` archive, or
   ``s3://`` registry version or archive, which needs the ``s3`` extra), bounded by ``updates.max_bytes``, into a
   staging folder renamed into its own folder once complete;
3. verify it against the release, once, just before it loads: the manifest's sha256 is the release's, the ed25519
   signature is by a trusted key, every file matches the manifest (:func:`models.edge.registry.verify_release`); a
   folder that fails is removed;
4. load it beside the running model, each file read against that verified manifest;
5. self-test it on the agent's recent windows: it scores them without error, every risk is a probability, it reads
   enough of the sensors this edge has, and it is fast enough;
6. swap it in atomically, keeping the old one for rollback, and send a heartbeat with the new version.

Anything that fails is refused with a logged reason and the old model keeps serving. A refusal of a genuine release
whose artifact failed is remembered by the digest of that exact message (so it is not fetched again, and a tampered
copy can never shadow the genuine one); a fetch that failed is retried. A model that later fails while scoring is
rolled back by the agent, and no release of it is taken again. Whatever a record holds, the follower logs why it
skips it and moves on.
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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import AwareDatetime, BaseModel, ConfigDict, TypeAdapter, ValidationError

from edge_agent.config import EdgeConfig, SelfTestSpec
from edge_agent.scorers import RunningModel, ScorerSlot, load_trusted_keys, open_lm
from models.edge.object_registry import download_objects
from models.edge.registry import ArtifactError, unpack, verify_release
from models.edge.releases import (
    KEYRING_FILE,
    ExpiredReleaseError,
    KeyRotationError,
    check_not_expired,
    current_trust,
    load_keyring,
    release_digest,
    save_keyring,
    verify_release_statement,
)
from models.edge.scoring import Scorer, Window
from models.edge.signing import SignatureError
from precursor.contracts.messages import ContractError, ModelRelease, decode
from precursor.contracts.object_store import S3_PROTOCOLS, ObjectStoreError, ObjectStoreSettings, explain, filesystem
from precursor.contracts.outcomes import ANY_FAILURE
from precursor.contracts.versions import version_key

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log = logging.getLogger("precursor.edge.updates")

REFUSED_FILE = "refused.json"
RELEASES_FILE = "releases.json"
RELEASE_PREFIX = "release:"
MAX_RELEASE_BYTES = 1 << 20
"""A release message is a few kilobytes; a record past this is refused before it is parsed."""
RETRY_S = 30.0
"""How long after a failed fetch the follower tries the same release again (unless a newer one came)."""


class UpdateRefused(Exception):
    """A release the edge will not run; the text says why. ``lasting``: the same release would fail again (a fetch
    that failed is not lasting: the link or the server may be back later)."""

    def __init__(self, reason: str, *, lasting: bool = True) -> None:
        super().__init__(reason)
        self.lasting = lasting


@dataclass(frozen=True)
class UpdateOutcome:
    release: ModelRelease
    applied: bool
    reason: str
    seconds: float
    retry: bool = False


class AcceptedRelease(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str
    version: str
    sha256: str
    digest: str
    released_at: AwareDatetime


_LEDGER = TypeAdapter(dict[str, AcceptedRelease])


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
        from models.edge.tokenizer import TelemetryTokenizer, TokenizerError

        return list(TelemetryTokenizer.load(artifact).sensors)
    except (TokenizerError, OSError, ValueError):
        return None


class ReleaseLedger:
    """The newest release this edge accepted per target, kept in ``releases.json`` so it survives restarts: the edge
    never goes back to an older one, and never takes another artifact under a version it already accepted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted: dict[str, AcceptedRelease] = self._load()

    def _load(self) -> dict[str, AcceptedRelease]:
        try:
            return _LEDGER.validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValidationError as err:
            # Written atomically, so only a hand edit or a disk fault gets here; signatures and expiry still hold.
            log.error("model updates: %s is unreadable (%s); starting without accepted releases", self.path, err)
            return {}

    def check(self, release: ModelRelease, digest: str, running: RunningModel) -> str | None:
        """Why taking ``release`` is a no-op (a repeat of the accepted one), None to go on, or
        :class:`UpdateRefused` when it would go back: older, a downgrade, or another artifact under one version.

        Before any release was accepted for the target, the model running (the one the edge was installed with) is
        the mark a release must not go below."""
        accepted = self.accepted.get(release.target)
        if accepted is None:
            if running.sha256 is not None and running.scorer.name == release.model_name:
                self._not_back(release, running.scorer.version, running.sha256, "running here")
            return None
        this = f"{release.version} (issued {release.released_at.isoformat()})"
        that = f"{accepted.version} (issued {accepted.released_at.isoformat()})"
        if digest == accepted.digest:
            return f"a repeat of the release accepted for target {release.target!r}: nothing to do"
        if release.released_at < accepted.released_at:
            raise UpdateRefused(
                f"replayed or stale: release {this} is older than release {that}, accepted for target "
                f"{release.target!r}"
            )
        if release.released_at == accepted.released_at:
            raise UpdateRefused(
                f"release {this} differs from release {that}, accepted for target {release.target!r} with the same "
                "issue time"
            )
        self._not_back(release, accepted.version, accepted.sha256, f"accepted for target {release.target!r}")
        return None

    @staticmethod
    def _not_back(release: ModelRelease, version: str, sha256: str, where: str) -> None:
        if version_key(release.version) < version_key(version) and not release.rollback:
            raise UpdateRefused(
                f"downgrade: version {release.version} is older than version {version}, {where}; only a release "
                "signed as a rollback goes back"
            )
        if release.version == version and release.sha256 != sha256:
            raise UpdateRefused(
                f"version {release.version} is {where} with artifact {sha256[:12]}; this release of version "
                f"{release.version} has another ({release.sha256[:12]})"
            )

    def accept(self, release: ModelRelease, digest: str) -> None:
        self.accepted[release.target] = AcceptedRelease(
            model_name=release.model_name,
            version=release.version,
            sha256=release.sha256,
            digest=digest,
            released_at=release.released_at,
        )
        _write_atomically(self.path, _LEDGER.dump_json(self.accepted, indent=1))


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    temp.replace(path)


class ModelUpdater:
    """Applies releases to a :class:`ScorerSlot`; the thread that follows Kafka calls :meth:`apply`.

    Every release is judged in this order, and every outcome is logged with its reason: meant for this edge; not
    refused before (remembered by :func:`~models.edge.releases.release_digest`, so a tampered copy never shadows the
    genuine release); key rotations it carries; its signature as a whole; not expired; not older than what was
    accepted for its target; its model never failed here; then fetch, verify, load, self-test and swap.
    """

    def __init__(
        self,
        config: EdgeConfig,
        slot: ScorerSlot,
        recent_windows: Callable[[], list[Window]],
        on_change: Callable[[], None] = lambda: None,
        object_store: ObjectStoreSettings | None = None,
    ) -> None:
        self.config = config
        self.object_store = object_store  # None: PRECURSOR_S3_* / AWS_* of the environment, read when fetching
        self.slot = slot
        self.recent_windows = recent_windows
        self.on_change = on_change
        self.models_dir = config.state_dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.trust = current_trust(load_trusted_keys(config.model.trusted_keys), self.models_dir / KEYRING_FILE)
        self.ledger = ReleaseLedger(self.models_dir / RELEASES_FILE)
        self.refused: dict[str, str] = self._load_refused()
        self._lock = threading.Lock()
        self.applied = 0
        self.last_refusal: str | None = None
        self.outcomes: deque[UpdateOutcome] = deque(maxlen=100)

    @property
    def trusted_keys(self) -> dict[str, Ed25519PublicKey]:
        """The keys that sign releases and artifacts now: the configured ones, moved on by accepted rotations."""
        return self.trust.keys

    def _load_refused(self) -> dict[str, str]:
        path = self.models_dir / REFUSED_FILE
        try:
            return {str(k): str(v) for k, v in json.loads(path.read_text()).items()}
        except (FileNotFoundError, json.JSONDecodeError, AttributeError):
            return {}

    def model_failed(self, model: RunningModel, reason: str) -> None:
        """A model that was running failed (and was rolled back): no release of its artifact is taken again."""
        if model.sha256 is not None:
            self.last_refusal = f"{model.label}: failed while running: {reason}"
            self._remember(model.sha256, self.last_refusal)

    def _remember(self, key: str, description: str) -> None:
        with self._lock:  # the updater's thread refuses releases, the agent's thread reports failed models
            self.refused[key] = description
            _write_atomically(self.models_dir / REFUSED_FILE, json.dumps(self.refused, indent=1).encode())

    def concerns_us(self, release: ModelRelease) -> str | None:
        """Why this edge skips the release without looking further, or None if it is meant for this edge."""
        edge_id = self.config.edge_id
        if release.target not in self.config.updates.targets and release.target != edge_id:
            return f"target {release.target!r} is not one of this edge's ({', '.join(self.config.updates.targets)})"
        if release.canary_edges and edge_id not in release.canary_edges:
            return "a canary release for other edges"
        return None

    def _check_statement(self, release: ModelRelease) -> None:
        """Follow the key rotations the release carries, then check its signature and expiry; raise
        :class:`UpdateRefused` naming what is wrong."""
        try:
            trust = self.trust.follow(release.keyring)
        except KeyRotationError as err:
            raise UpdateRefused(f"key rotation refused: {err}") from None
        if trust.version != self.trust.version:
            revoked = sorted(set(self.trust.keys) - set(trust.keys))
            kept = [r for r in release.keyring if r.version <= trust.version]
            known = {r.version: r for r in load_keyring(self.models_dir / KEYRING_FILE)}
            save_keyring(
                self.models_dir / KEYRING_FILE,
                sorted({**known, **{r.version: r for r in kept}}.values(), key=lambda r: r.version),
            )
            log.warning(
                "model updates: keys rotated from %s to %s; revoked: %s",
                self.trust.describe(),
                trust.describe(),
                ", ".join(revoked) or "none",
            )
            self.trust = trust
        try:
            verify_release_statement(release, self.trust.keys)
        except SignatureError as err:
            raise UpdateRefused(f"signature check failed: {err}") from None
        try:
            check_not_expired(release)
        except ExpiredReleaseError as err:
            raise UpdateRefused(f"expired: {err}") from None

    def apply(self, release: ModelRelease) -> UpdateOutcome:
        started = time.monotonic()
        skip = self.concerns_us(release)
        if skip is not None:
            return self._done(release, started, applied=False, reason=skip)
        digest = release_digest(release)
        remembered = self.refused.get(f"{RELEASE_PREFIX}{digest}")
        if remembered is not None:
            return self._done(release, started, applied=False, reason=f"refused before: {remembered}")
        try:
            self._check_statement(release)
            failed = self.refused.get(release.sha256)
            if failed is not None:
                raise UpdateRefused(f"its model failed here before: {failed}")
            repeat = self.ledger.check(release, digest, self.slot.running)
        except UpdateRefused as err:
            return self._done(release, started, applied=False, reason=str(err), refused=True)
        if repeat is not None:
            return self._done(release, started, applied=False, reason=repeat)
        if release.sha256 == self.slot.running.sha256:
            self.ledger.accept(release, digest)
            return self._done(release, started, applied=False, reason="already running")
        fields = {"model_name": release.model_name, "model_version": release.version, "model_sha256": release.sha256}
        log.info("model release %s %s: fetching and verifying", release.model_name, release.version, extra=fields)
        try:
            new = self._prepare(release)
            old = self.slot.swap(new)
        except UpdateRefused as err:
            if err.lasting:  # the same bytes would fail the same way; a fetch that failed may work later
                self._remember(f"{RELEASE_PREFIX}{digest}", f"{release.model_name} {release.version}: {err}")
            return self._done(release, started, applied=False, reason=str(err), refused=True, retry=not err.lasting)
        self.ledger.accept(release, digest)
        self.applied += 1
        self._prune(keep={new.artifact, old.artifact})
        self.on_change()
        return self._done(release, started, applied=True, reason="applied")

    def _done(
        self,
        release: ModelRelease,
        started: float,
        *,
        applied: bool,
        reason: str,
        refused: bool = False,
        retry: bool = False,
    ) -> UpdateOutcome:
        outcome = UpdateOutcome(release, applied, reason, time.monotonic() - started, retry=retry)
        self.outcomes.append(outcome)
        fields = {
            "model_name": release.model_name,
            "model_version": release.version,
            "model_sha256": release.sha256,
            "reason": reason,
        }
        if applied:
            log.info(
                "model update applied in %.2f s",
                outcome.seconds,
                extra={**fields, "seconds": round(outcome.seconds, 3)},
            )
        elif refused:
            self.last_refusal = f"{release.model_name} {release.version}: {reason}"
            log.error("model update refused, %s keeps serving: %s", self.slot.running.label, reason, extra=fields)
        else:
            log.info("model release %s %s skipped: %s", release.model_name, release.version, reason, extra=fields)
        return outcome

    def _prepare(self, release: ModelRelease) -> RunningModel:
        if release.size_bytes > self.config.updates.max_bytes:
            raise UpdateRefused(
                f"size_bytes={release.size_bytes} is over updates.max_bytes={self.config.updates.max_bytes}"
            )
        final = self.models_dir / f"{release.model_name}-{release.version}-{release.sha256[:12]}"
        if not final.is_dir():
            # Checked once, in place, just before it loads: a folder refused there is removed below.
            self._fetch(release).rename(final)
        try:
            return self._load_and_test(release, final)
        except UpdateRefused:
            in_use = {m.artifact for m in (self.slot.running, self.slot.previous) if m is not None}
            if final not in in_use:
                shutil.rmtree(final, ignore_errors=True)
            raise

    def _load_and_test(self, release: ModelRelease, final: Path) -> RunningModel:
        try:
            new = open_lm(final, self.config.model, verify_release(release, final, self.trusted_keys))
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
                    raise UpdateRefused(f"artifact_uri {release.artifact_uri}: no such file or folder", lasting=False)
            elif uri.scheme in ("http", "https"):
                archive = staging / "artifact.tar"
                self._download(release.artifact_uri, archive)
                unpack(archive, target, max_bytes=self.config.updates.max_bytes)
                archive.unlink()
            elif uri.scheme in S3_PROTOCOLS:
                self._fetch_object(release.artifact_uri, staging, target)
            else:
                raise UpdateRefused(f"artifact_uri scheme {uri.scheme!r} is not supported (file, http, https, s3)")
        except ArtifactError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise UpdateRefused(f"cannot unpack the artifact: {err}") from None
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise UpdateRefused(f"cannot fetch {release.artifact_uri}: {err}", lasting=False) from None
        except UpdateRefused:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        # The artifact goes one level up so that the staging folder itself is what gets renamed into place.
        for entry in target.iterdir():
            entry.rename(staging / entry.name)
        target.rmdir()
        return staging

    def _fetch_object(self, url: str, staging: Path, target: Path) -> None:
        """An artifact on an object store: a registry version (the objects under ``url/``) or one packed archive."""
        try:
            fs, path = filesystem(url, self.object_store)
            self._copy_objects(fs, path.rstrip("/"), url, staging, target)
        except (UpdateRefused, ArtifactError):
            raise
        except Exception as err:
            # Refused credentials, no bucket, no endpoint, no s3 extra: each is fixed on this edge or at the store,
            # not by a new release, so the release is tried again. The error names the URL (never a secret).
            failure = err if isinstance(err, ObjectStoreError) else explain(err, url, self.object_store)
            reason = str(failure) if failure is not None else f"{url}: {type(err).__name__}: {err}"
            raise UpdateRefused(f"cannot fetch the artifact: {reason}", lasting=False) from None

    def _copy_objects(self, fs: AbstractFileSystem, path: str, url: str, staging: Path, target: Path) -> None:
        limit = self.config.updates.max_bytes
        fs.invalidate_cache()  # listings cached by an earlier fetch may be stale
        if fs.isfile(path):
            size = fs.size(path)
            if size is not None and size > limit:
                raise UpdateRefused(f"artifact at {url} is {size} bytes, larger than updates.max_bytes={limit}")
            fs.get_file(path, str(staging / "artifact.tar"))
            unpack(staging / "artifact.tar", target, max_bytes=limit)
            (staging / "artifact.tar").unlink()
            return
        found = fs.find(path, detail=True)
        if not found:
            raise UpdateRefused(f"artifact_uri {url}: no such object or prefix", lasting=False)
        total = sum(int(info.get("size") or 0) for info in found.values())
        if total > limit:
            raise UpdateRefused(f"artifact at {url} is {total} bytes, larger than updates.max_bytes={limit}")
        try:
            download_objects(fs, path, found, target, f"artifact at {url}")
        except ArtifactError as err:  # a name that would land outside the artifact: the release itself is bad
            raise UpdateRefused(str(err)) from None

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
    each new release. Keeps retrying while the broker is away, retries a release whose fetch failed, and outlives any
    record: :meth:`handle` logs why it skips one and never raises."""

    def __init__(self, config: EdgeConfig, updater: ModelUpdater, stop: threading.Event) -> None:
        super().__init__(name="model-updates", daemon=True)
        self.config = config
        self.updater = updater
        self.stop_event = stop
        self.releases_seen = 0
        self.records_skipped = 0
        self._retry: dict[bytes | None, tuple[bytes, float]] = {}

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
                    latest: dict[bytes | None, bytes | None] = {}
                    for records in polled.values():
                        for record in records:
                            latest[record.key] = record.value  # a compacted topic: only the last per key counts
                    for key, value in latest.items():
                        self._retry.pop(key, None)  # a newer record for this key replaces a pending retry
                        self._handle_keyed(key, value)
                    now = time.monotonic()
                    for key, (value, due) in list(self._retry.items()):
                        if due <= now:
                            del self._retry[key]
                            self._handle_keyed(key, value)
            except (KafkaError, OSError) as err:
                log.info("model updates: %s; retrying in %.0f s", err, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as err:  # a client fault must not end the thread: nothing would update this edge again
                log.exception("model updates: %s: %s; starting again in %.0f s", type(err).__name__, err, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            finally:
                if consumer is not None:
                    try:
                        consumer.close()
                    except Exception as err:  # closing a broken client must not end the thread either
                        log.warning("model updates: closing the consumer: %s: %s", type(err).__name__, err)

    def _handle_keyed(self, key: bytes | None, value: bytes | None) -> None:
        outcome = self.handle(value)
        if outcome is not None and outcome.retry and value is not None:
            self._retry[key] = (value, time.monotonic() + RETRY_S)

    def handle(self, value: bytes | None) -> UpdateOutcome | None:
        """Apply or refuse one record of the topic, whatever it holds; the outcome, or None for a record that is not
        a release (logged with the reason). Never raises."""
        if value is None:
            log.info("model updates: a tombstone (a deleted release), nothing to apply")
            return None
        self.releases_seen += 1
        try:
            if not isinstance(value, bytes | bytearray | memoryview):
                raise ContractError(f"ModelRelease: a record value of type {type(value).__name__}, not bytes")
            if len(value) > MAX_RELEASE_BYTES:
                raise ContractError(
                    f"ModelRelease: a record of {len(value)} bytes, over the {MAX_RELEASE_BYTES} a release can be"
                )
            release = decode(ModelRelease, bytes(value))
        except ContractError as err:
            self.records_skipped += 1
            log.error("model updates: a record that is not a ModelRelease was skipped: %s", _short(str(err)))
            return None
        except Exception as err:  # what a hostile record trips in the JSON reader (depth, digits) must not stop us
            self.records_skipped += 1
            log.error("model updates: an unreadable record was skipped: %s: %s", type(err).__name__, _short(str(err)))
            return None
        try:
            return self.updater.apply(release)
        except Exception as err:  # a fault in one release (disk full, a loader bug) must not stop the next one
            self.records_skipped += 1
            log.exception(
                "model updates: release %s %s failed unexpectedly and was skipped: %s: %s",
                release.model_name,
                release.version,
                type(err).__name__,
                _short(str(err)),
            )
            return None


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
