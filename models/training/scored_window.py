"""One test window's outcome and score: what window-level (:mod:`models.training.evaluate`) and alert-level
(:mod:`models.training.alert_level`) figures are both computed from, in a module of its own so neither imports the other
for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoredWindow:
    """One test window's outcome and score."""

    machine_id: str
    end_s: int
    failed: bool
    hours_to_failure: float | None
    score: float
