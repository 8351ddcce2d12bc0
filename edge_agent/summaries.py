"""Telemetry summaries: what each sensor of a machine did per period (mean, min, max, last value, count), for the
dashboard's sensor lines. They go to ``<prefix>.telemetry``; the raw readings stay at the edge.

Periods lie on multiples of ``interval`` since the epoch. The window builder shows the summarizer a machine's held
readings whenever it passes one of the machine's boundaries (:class:`~edge_agent.windows.BoundaryObserver`); the
summarizer then summarizes the periods that ended since the boundary before, so a machine sends at most one summary
per interval, and each reading it accepted lands in exactly one summary. That previous boundary is what the window
journal keeps, and the summaries are committed with it: after a restart no period is summarized twice or skipped.

A period's summary waits for the machine's next boundary at or after its end (for the reading that passes it), as a
window does. Periods without readings send nothing; a sensor without a value in a period is left out of it.

>>> summarizer = TelemetrySummarizer(interval_s=60)
>>> times = [0.0, 20.0, 40.0, 60.0]
>>> rows = [(1.0, 5.0), (3.0, float("nan")), (2.0, 7.0), (9.0, 9.0)]
>>> summarizer.passed("m-1", None, 60, times, rows, [("a", "b")] * 4)
>>> [summary] = summarizer.take()
>>> summary.start, summary.end, summary.readings
(0, 60, 3)
>>> summary.sensors["a"], summary.sensors["b"]
(SensorStats(mean=2.0, min=1.0, max=3.0, last=2.0, count=3), SensorStats(mean=6.0, min=5.0, max=7.0, last=7.0, count=2))
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np

from edge_agent.windows import value_matrix
from precursor.contracts.messages import MAX_SUMMARY_SENSORS, TelemetrySummary, validate


class SensorStats(NamedTuple):  # a tuple: a period makes one per sensor, and a frozen dataclass costs 1 µs each
    mean: float
    min: float
    max: float
    last: float
    count: int


@dataclass(frozen=True, slots=True)
class PeriodSummary:
    """One machine's readings over ``[start, end)`` (epoch seconds), per sensor."""

    machine_id: str
    start: int
    end: int
    readings: int
    sensors: dict[str, SensorStats]


class TelemetrySummarizer:
    """A :class:`~edge_agent.windows.BoundaryObserver` that collects the summaries of the periods that ended; the
    agent :meth:`take` s them at each commit."""

    def __init__(self, interval_s: int) -> None:
        if interval_s < 1:
            raise ValueError(f"interval_s={interval_s}: a summary period must be at least one second")
        self.interval_s = interval_s
        self._ready: list[PeriodSummary] = []

    def passed(
        self,
        machine_id: str,
        previous: int | None,
        boundary: int,
        times: list[float],
        rows: list[tuple[float, ...]],
        layouts: list[tuple[str, ...]],
    ) -> None:
        step = self.interval_s
        until = boundary // step * step  # periods ending at or before the boundary are complete
        if previous is None:
            lo = 0
        else:
            done = previous // step * step  # periods ending at or before the previous boundary were summarized then
            if until <= done:
                return
            lo = bisect.bisect_left(times, done)
        hi = bisect.bisect_left(times, until)
        while lo < hi:
            period = int(times[lo] // step)
            end = bisect.bisect_left(times, (period + 1) * step, lo, hi)
            self._ready.append(summarize(machine_id, period * step, step, rows[lo:end], layouts[lo:end]))
            lo = end

    def take(self) -> list[PeriodSummary]:
        """The summaries collected since the last take, oldest period first per machine."""
        ready, self._ready = self._ready, []
        return ready


def summarize(
    machine_id: str, start: int, length: int, rows: list[tuple[float, ...]], layouts: list[tuple[str, ...]]
) -> PeriodSummary:
    """The summary of one period's readings (in time order, NaN for a missing value)."""
    sensors, values = value_matrix(rows, layouts, np.float64)  # (T, S)
    missing = np.isnan(values)
    if not missing.any():  # the usual period: every reading has every sensor
        count = [len(values)] * len(sensors)
        low, high = values.min(axis=0), values.max(axis=0)
        mean, last = values.sum(axis=0) / len(values), values[-1]
    else:
        present = ~missing
        count = present.sum(axis=0).tolist()
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(present, values, 0.0).sum(axis=0) / count
        low = np.where(present, values, np.inf).min(axis=0)
        high = np.where(present, values, -np.inf).max(axis=0)
        newest = len(values) - 1 - np.argmax(present[::-1], axis=0)  # the last row with a value, per sensor
        last = values[newest, np.arange(len(sensors))]
    # A float sum can put the mean of equal values a rounding step past them; the mean lies between min and max.
    mean = np.minimum(np.maximum(mean, low), high)
    stats = {
        name: SensorStats(*figures)
        for name, *figures in zip(
            sensors, mean.tolist(), low.tolist(), high.tolist(), last.tolist(), count, strict=True
        )
        if figures[-1]  # a sensor without a value all period says nothing
    }
    return PeriodSummary(machine_id, start, start + length, len(rows), stats)


def summary_messages(summary: PeriodSummary, edge_id: str, next_seq: Callable[[], int]) -> list[TelemetrySummary]:
    """The period as messages: one, or one per MAX_SUMMARY_SENSORS sensors; none where no reading had a value.
    Raises :class:`~precursor.contracts.messages.ContractError` naming what does not fit the contract."""
    names = sorted(summary.sensors)
    return [
        validate(
            TelemetrySummary,
            {
                "edge_id": edge_id,
                "seq": next_seq(),
                "machine_id": summary.machine_id,
                "window_start": datetime.fromtimestamp(summary.start, UTC),
                "window_end": datetime.fromtimestamp(summary.end, UTC),
                "readings": summary.readings,
                "sensors": {n: summary.sensors[n]._asdict() for n in names[first : first + MAX_SUMMARY_SENSORS]},
            },
        )
        for first in range(0, len(names), MAX_SUMMARY_SENSORS)
    ]
