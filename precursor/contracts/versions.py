"""The order of model versions, as people read them: the edge refuses a release older than the one it runs, the
registry lists versions oldest first and the store names the newest version a fleet runs, all by this one rule.

>>> sorted(["0.10.0", "0.9.2", "0.9.10", "2026.1.5", "1.0.0-rc1"], key=version_key)
['0.9.2', '0.9.10', '0.10.0', '1.0.0-rc1', '2026.1.5']
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def version_key(version: str) -> tuple[tuple[int, str], ...]:
    """A sort key in which digit runs compare as numbers (so 0.10.0 comes after 0.9.2) and other runs as text,
    before any number at the same place."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in _DIGITS.split(version) if part)
