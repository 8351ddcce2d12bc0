"""Who an edge is: its own ed25519 key pair, made once by ``precursor edge enroll``, and the agent build it runs.

The pair lives in ``STATE_DIR/identity/``: ``edge.key`` (mode 0600, never printed or logged) and ``edge.pub``, with
``enrollment.txt`` holding the line an operator adds to the fleet's enrolled-edges file
(:mod:`precursor.contracts.enrollment`).
An enrolled edge signs every heartbeat over :meth:`~precursor.contracts.messages.Heartbeat.statement`; the pipeline
checks the
signature against the enrolled-edges file, so a heartbeat in an edge's name that the edge did not send is flagged.

>>> import tempfile
>>> from precursor.contracts.messages import Heartbeat
>>> state_dir = Path(tempfile.mkdtemp())
>>> enrollment = enroll(state_dir, "plant-7-gw-1")
>>> enrollment.created, enrollment.line.startswith("plant-7-gw-1 ed25519:")
(True, True)
>>> identity = EdgeIdentity.load(state_dir, "plant-7-gw-1")
>>> beat = Heartbeat(edge_id="plant-7-gw-1", seq=1, timestamp="2026-01-01T00:00:00Z", model_name="zscore",
...                  model_version="1", agent=agent_build())
>>> identity.sign(beat).signature.key_id == enrollment.key_id
True
>>> enroll(state_dir, "plant-7-gw-1").created  # a second enroll keeps the key the fleet already knows
False
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from models.edge.signing import (
    PRIVATE_KEY_SUFFIX,
    PUBLIC_KEY_SUFFIX,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    public_key_text,
    sign,
)
from precursor.contracts.enrollment import enrollment_line
from precursor.contracts.messages import AgentBuild, Heartbeat, HeartbeatSignature

log = logging.getLogger("precursor.edge")

IDENTITY_DIR = "identity"
KEY_NAME = "edge"
ENROLLMENT_FILE = "enrollment.txt"
DISTRIBUTION = "precursor"
AGENT_PACKAGES = ("precursor/contracts", "edge_agent", "models/edge")
"""The packages an edge agent runs (folders from the install root): their source files make the build hash."""


@dataclass(frozen=True)
class Enrollment:
    """An edge's key pair and the line that enrolls it. ``created`` is False when the edge already had its key."""

    edge_id: str
    key_id: str
    line: str
    private_key_path: Path
    public_key_path: Path
    created: bool


def identity_dir(state_dir: Path | str) -> Path:
    return Path(state_dir) / IDENTITY_DIR


def enroll(state_dir: Path | str, edge_id: str) -> Enrollment:
    """Make the edge's key pair in its state dir, unless it has one: a key the fleet knows is never replaced."""
    directory = identity_dir(state_dir)
    private_path = directory / f"{KEY_NAME}{PRIVATE_KEY_SUFFIX}"
    public_path = directory / f"{KEY_NAME}{PUBLIC_KEY_SUFFIX}"
    created = not private_path.exists()
    if created:
        generate_keypair(directory, KEY_NAME)
    elif not public_path.exists():
        raise FileNotFoundError(f"{private_path} exists without {public_path}: restore it, or remove both to re-enroll")
    public_key = load_public_key(public_path)
    line = enrollment_line(edge_id, public_key_text(public_key))
    (directory / ENROLLMENT_FILE).write_text(line + "\n")
    return Enrollment(edge_id, key_id(public_key), line, private_path, public_path, created)


class EdgeIdentity:
    """The edge's private key, held to sign its heartbeats. Its repr names the key id, never the key."""

    def __init__(self, edge_id: str, private_key: Ed25519PrivateKey) -> None:
        self.edge_id = edge_id
        self._private_key = private_key
        self.key_id = key_id(private_key.public_key())

    @classmethod
    def load(cls, state_dir: Path | str, edge_id: str) -> EdgeIdentity | None:
        """The identity ``precursor edge enroll`` made in ``state_dir``; None when the edge was never enrolled."""
        path = identity_dir(state_dir) / f"{KEY_NAME}{PRIVATE_KEY_SUFFIX}"
        if not path.exists():
            return None
        return cls(edge_id, load_private_key(path))

    def sign(self, heartbeat: Heartbeat) -> Heartbeat:
        """The heartbeat with this edge's signature over its statement."""
        if heartbeat.edge_id != self.edge_id:
            raise ValueError(f"identity of edge {self.edge_id!r} cannot sign a heartbeat of edge {heartbeat.edge_id!r}")
        # The statement covers the key id, so it is set first, with a placeholder for the value it leaves out.
        claimed = heartbeat.model_copy(update={"signature": HeartbeatSignature(key_id=self.key_id, value="-")})
        value = sign(claimed.statement(), self._private_key)
        return heartbeat.model_copy(update={"signature": HeartbeatSignature(key_id=self.key_id, value=value)})

    def __repr__(self) -> str:
        return f"EdgeIdentity(edge_id={self.edge_id!r}, key_id={self.key_id!r})"


@cache
def agent_build() -> AgentBuild:
    """The installed package version and a sha256 over the agent's source files (path and bytes of each, in order),
    so two edges reporting one version but running different code tell apart."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"  # run from a source tree that was never installed
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in AGENT_PACKAGES:
        if not (root / package).is_dir():  # a missing package would silently leave its code out of the hash
            raise FileNotFoundError(f"agent build hash: no package folder {root / package}")
        for path in sorted((root / package).rglob("*.py")):
            content = path.read_bytes()
            digest.update(f"{path.relative_to(root).as_posix()}\0{len(content)}\0".encode())
            digest.update(content)
    return AgentBuild(version=version, sha256=digest.hexdigest())
