"""The one interface every scorer shares: a window of one machine's telemetry in, risk per failure kind out.

A :class:`Window` is what an edge agent hands a scorer. Scorers are pure: ``score`` never mutates the window and
keeps no per-call state, so the same window always gets the same risk (River's habit: tiny, uniform verbs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

import numpy as np

from precursor.contracts.messages import Event


@dataclass(frozen=True)
class Window:
    """One machine's recent telemetry, with the context a scorer may use.

    ``values[t, j]`` is sensor ``sensors[j]`` at ``timestamps[t]`` (epoch seconds, ascending); NaN is missing.
    ``events`` are this machine's events up to ``end`` (errors, maintenance, earlier failures), oldest first.
    """

    machine_id: str
    start: datetime
    end: datetime
    timestamps: np.ndarray  # (T,) int64
    sensors: tuple[str, ...]
    values: np.ndarray  # (T, S) float32
    events: tuple[Event, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape != (len(self.timestamps), len(self.sensors)):
            raise ValueError(
                f"window {self.machine_id}: values shape {self.values.shape} does not match "
                f"{len(self.timestamps)} timestamps x {len(self.sensors)} sensors"
            )


Risk = dict[str, float]
"""Failure kind -> probability of that failure within the scorer's horizon. Always has
:data:`precursor.contracts.outcomes.ANY_FAILURE`."""


@runtime_checkable
class Scorer(Protocol):
    """Anything that turns windows into risks. ``name`` and ``version`` go into every prediction it makes."""

    name: str
    version: str
    horizon_h: float

    def score(self, window: Window) -> Risk: ...

    def score_many(self, windows: Sequence[Window]) -> list[Risk]: ...
