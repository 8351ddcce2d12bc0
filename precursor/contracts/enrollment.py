"""The enrolled-edges file: the fleet's register of which public key speaks for which edge.

One line per key, ``EDGE_ID ed25519:BASE64`` (the 32 raw bytes of the edge's ed25519 public key), as
``precursor edge enroll`` prints it for the operator to add. ``#`` starts a comment; blank lines are ignored. An edge
may have more than one line (a new key while the old one is retired); a key may speak for one edge only.

>>> line = enrollment_line("plant-7-gw-1", "A" * 43 + "=")
>>> line
'plant-7-gw-1 ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA='
>>> parse_enrolled_edges(line + "  # pump house\\n# retired:\\n", "edges.txt")
[EnrolledKey(edge_id='plant-7-gw-1', public_key='AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=', line=1)]
>>> parse_enrolled_edges("plant-7 rsa:AAAA", "edges.txt")
Traceback (most recent call last):
...
precursor.contracts.enrollment.EnrollmentError: edges.txt line 1: key 'rsa:AAAA' must be ed25519:BASE64 (32 bytes)
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

KEY_PREFIX = "ed25519:"
_RAW_KEY_BYTES = 32
_EDGE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")  # precursor.contracts.messages.Identifier


class EnrollmentError(ValueError):
    """An enrolled-edges file that cannot be trusted as written. The text names the file and line."""


@dataclass(frozen=True)
class EnrolledKey:
    """One line of the file: an edge and a public key (base64 of its raw bytes) that may sign for it."""

    edge_id: str
    public_key: str
    line: int


def enrollment_line(edge_id: str, public_key_b64: str) -> str:
    """The line an operator adds to the enrolled-edges file for this edge and key."""
    return f"{edge_id} {KEY_PREFIX}{public_key_b64}"


def parse_enrolled_edges(text: str, where: str) -> list[EnrolledKey]:
    """Every enrolled key in ``text`` (the file's content; ``where`` names it in errors). A malformed line, or a key
    listed for two edges, is an error: a register that is half read would flag honest edges as forged."""
    keys: list[EnrolledKey] = []
    owner: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue
        parts = content.split()
        if len(parts) != 2:
            raise EnrollmentError(f"{where} line {number}: expected 'EDGE_ID {KEY_PREFIX}BASE64', got {content[:80]!r}")
        edge_id, key = parts
        if not _EDGE_ID.match(edge_id):
            raise EnrollmentError(f"{where} line {number}: edge_id {edge_id[:80]!r} is not a valid edge id")
        public_key = key.removeprefix(KEY_PREFIX)
        if public_key == key or not _is_raw_key(public_key):
            raise EnrollmentError(
                f"{where} line {number}: key {key[:60]!r} must be {KEY_PREFIX}BASE64 ({_RAW_KEY_BYTES} bytes)"
            )
        if owner.setdefault(public_key, edge_id) != edge_id:
            raise EnrollmentError(
                f"{where} line {number}: this key is already enrolled for edge {owner[public_key]!r}; "
                "one key speaks for one edge"
            )
        keys.append(EnrolledKey(edge_id, public_key, number))
    return keys


def _is_raw_key(text: str) -> bool:
    try:
        return len(base64.b64decode(text, validate=True)) == _RAW_KEY_BYTES
    except (binascii.Error, ValueError):
        return False
