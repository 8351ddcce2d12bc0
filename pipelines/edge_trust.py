"""Whether a heartbeat comes from the edge it names, and whether that edge runs a model the fleet released.

Every heartbeat is judged once, as it is parsed, and stored with the verdict, never dropped for it:

- ``verified``: signed by a key the enrolled-edges file (:mod:`precursor.contracts.enrollment`) lists for its edge_id;
- ``unsigned``: no signature (an edge not enrolled yet, or an agent older than heartbeat schema 2);
- ``forged``: a signature that does not hold: made by a key not enrolled for that edge (another edge's, or none the
  fleet knows), over other bytes than the heartbeat carries, or not a signature at all.

``model_known`` says whether the model hash it reports is a release in the model registry (None where no registry
is configured or the edge runs no artifact, e.g. a built-in baseline).

>>> import tempfile
>>> from pathlib import Path
>>> from precursor.contracts.messages import Heartbeat
>>> from edge_agent.identity import EdgeIdentity, enroll
>>> state = Path(tempfile.mkdtemp())
>>> enrolled = Path(tempfile.mkdtemp()) / "enrolled-edges"
>>> _ = enrolled.write_text(enroll(state, "edge-1").line + "\\n")
>>> judge = HeartbeatJudge.from_files(enrolled, None)
>>> beat = Heartbeat(edge_id="edge-1", seq=4, timestamp="2026-01-01T00:00:00Z", model_name="zscore", model_version="1")
>>> signed = EdgeIdentity.load(state, "edge-1").sign(beat)
>>> judge.judge(signed).trust, judge.judge(beat).trust
('verified', 'unsigned')
>>> tampered = judge.judge(signed.model_copy(update={"health": "failing"}))
>>> tampered.trust, "does not match the signed data" in tampered.reason
('forged', True)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from models.edge.object_registry import version_objects
from models.edge.registry import MANIFEST_FILE, artifact_sha256, manifest_sha256
from models.edge.signing import SignatureError, key_id, public_key_from_text, verify
from pipelines.records import HeartbeatRecord, heartbeat_record
from precursor.contracts.enrollment import EnrolledKey, EnrollmentError, parse_enrolled_edges
from precursor.contracts.messages import Heartbeat
from precursor.contracts.object_store import as_location

Trust = Literal["verified", "unsigned", "forged"]
TRUST_STATES: tuple[Trust, ...] = ("verified", "unsigned", "forged")


@dataclass(frozen=True)
class Verdict:
    trust: Trust
    reason: str | None
    model_known: bool | None


class HeartbeatJudge:
    """Judges heartbeats against the enrolled keys and the released model hashes it was built with.

    Beam ships it to its workers by pickling: it keeps keys as text and makes key objects on first use there.
    """

    def __init__(self, enrolled: Iterable[EnrolledKey] | None, releases: Iterable[str] | None) -> None:
        """``enrolled`` None: no enrolled-edges file is configured, so no signature can be verified.
        ``releases`` None: no model registry is configured, so whether a model is known is not judged."""
        self._enrolled = None if enrolled is None else tuple(enrolled)
        self._releases = None if releases is None else frozenset(releases)
        self._keys: dict[str, dict[str, Ed25519PublicKey]] | None = None

    @classmethod
    def from_files(cls, enrolled_edges: Path | None, model_registry: Path | str | None) -> HeartbeatJudge:
        """Read the enrolled-edges file and the registry's release hashes; a file that is missing or malformed is an
        error here, before anything is judged by half a register."""
        enrolled = None
        if enrolled_edges is not None:
            try:
                text = Path(enrolled_edges).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise EnrollmentError(f"cannot read the enrolled-edges file {enrolled_edges}: {err}") from None
            enrolled = parse_enrolled_edges(text, str(enrolled_edges))
        releases = None if model_registry is None else release_hashes(model_registry)
        return cls(enrolled, releases)

    def __getstate__(self) -> dict[str, Any]:
        return {"_enrolled": self._enrolled, "_releases": self._releases, "_keys": None}

    def _keys_by_edge(self) -> dict[str, dict[str, Ed25519PublicKey]]:
        if self._keys is None:
            keys: dict[str, dict[str, Ed25519PublicKey]] = {}
            for entry in self._enrolled or ():
                public_key = public_key_from_text(entry.public_key)
                keys.setdefault(entry.edge_id, {})[key_id(public_key)] = public_key
            self._keys = keys
        return self._keys

    def judge(self, heartbeat: Heartbeat) -> Verdict:
        known = None
        if self._releases is not None and heartbeat.model_sha256 is not None:
            known = heartbeat.model_sha256 in self._releases
        trust, reason = self._trust(heartbeat)
        return Verdict(trust, reason, known)

    def _trust(self, heartbeat: Heartbeat) -> tuple[Trust, str | None]:
        signature = heartbeat.signature
        if signature is None:
            return "unsigned", f"no signature (heartbeat schema_version {heartbeat.schema_version})"
        if self._enrolled is None:
            return "forged", "no enrolled-edges file is configured (PRECURSOR_PIPELINE_ENROLLED_EDGES): no key is known"
        edge_keys = self._keys_by_edge().get(heartbeat.edge_id)
        if edge_keys is None:
            return "forged", f"edge {heartbeat.edge_id!r} is not enrolled"
        if signature.key_id not in edge_keys:
            return "forged", (
                f"key {signature.key_id} is not enrolled for edge {heartbeat.edge_id!r} "
                f"(enrolled: {', '.join(sorted(edge_keys))})"
            )
        try:
            verify(heartbeat.statement(), signature.value, signature.key_id, edge_keys)
        except SignatureError as err:
            return "forged", str(err)
        return "verified", None


def release_hashes(registry: Path | str) -> set[str]:
    """The hash every release of the registry is announced and reported by: sha256 of its manifest's bytes, for
    each ``ROOT/<model_name>/<version>/``. ``registry`` is a folder or an object store URL."""
    location = as_location(registry)
    if isinstance(location, str):
        fs, _, manifests = version_objects(location, [MANIFEST_FILE])
        return {manifest_sha256(fs.cat_file(p)) for p in manifests}
    if not location.is_dir():
        raise FileNotFoundError(f"model registry {location} is not a directory")
    return {artifact_sha256(path.parent) for path in location.glob(f"*/*/{MANIFEST_FILE}")}


class JudgedHeartbeatRecords:
    """``heartbeat -> HeartbeatRecord`` with its verdict: the ingest's ``to_record`` for heartbeats."""

    def __init__(self, judge: HeartbeatJudge) -> None:
        self.judge = judge

    def __call__(self, heartbeat: Heartbeat, *, partition: int, offset: int) -> HeartbeatRecord:
        verdict = self.judge.judge(heartbeat)
        return heartbeat_record(
            heartbeat,
            partition=partition,
            offset=offset,
            trust=verdict.trust,
            trust_reason=verdict.reason,
            model_known=verdict.model_known,
        )
