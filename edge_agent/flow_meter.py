"""What flows through an edge agent between two heartbeats: readings, windows and predictions per second, how long
scoring a window takes, and the CPU (and, where RAPL is readable, the energy) the agent used since it started.

The agent tells the meter about every scored batch (:meth:`FlowMeter.scored`); each heartbeat takes a report
(:meth:`FlowMeter.report`), which starts the next interval. Nothing here runs per reading.

>>> ticks = iter([0.0, 10.0])
>>> meter = FlowMeter(clock=lambda: next(ticks), cpu=lambda: 0.0, rapl=None)
>>> meter.scored(windows=4, wall_s=0.008, cpu_s=0.008)
>>> flow = meter.report(readings=500, windows=4, predictions=4)
>>> flow.readings_per_s, flow.windows_per_s, flow.scoring_ms_p50, round(flow.scoring_busy, 4)
(50.0, 0.4, 2.0, 0.0008)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from infra.energy import Rapl, process_cpu_s
from precursor.contracts.messages import EdgeFlow

KEEP = 4096
"""Per-window scoring times kept per interval for the percentiles: a bound on memory, whatever the rate."""


class FlowMeter:
    """Counts between heartbeats. Not thread-safe: the agent's own thread scores and heartbeats."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = process_cpu_s,
        rapl: Rapl | None = None,
    ) -> None:
        self._clock = clock
        self._cpu = cpu
        self._rapl = rapl
        self._cpu_start = cpu()
        self._since = clock()
        self._last = (0, 0, 0)  # readings, windows, predictions at the last report
        self._scoring_ms: deque[float] = deque(maxlen=KEEP)
        self._scoring_wall_s = 0.0
        self.scoring_cpu_s = 0.0

    def scored(self, *, windows: int, wall_s: float, cpu_s: float) -> None:
        """One batch of ``windows`` was scored in ``wall_s`` seconds, using ``cpu_s`` CPU seconds (the process's
        CPU time across the call, so the scorer's own worker threads count)."""
        if windows <= 0:
            return
        self._scoring_ms.extend([1000 * wall_s / windows] * min(windows, KEEP))
        self._scoring_wall_s += wall_s
        self.scoring_cpu_s += max(0.0, cpu_s)

    def report(self, *, readings: int, windows: int, predictions: int) -> EdgeFlow:
        """The interval since the last report, with the running totals; starts the next interval."""
        now = self._clock()
        interval = max(now - self._since, 1e-6)
        last_readings, last_windows, last_predictions = self._last
        times = np.fromiter(self._scoring_ms, dtype=np.float64)
        flow = EdgeFlow(
            interval_s=round(interval, 3),
            readings_per_s=max(0, readings - last_readings) / interval,
            windows_per_s=max(0, windows - last_windows) / interval,
            predictions_per_s=max(0, predictions - last_predictions) / interval,
            scoring_ms_p50=float(np.percentile(times, 50)) if times.size else None,
            scoring_ms_p95=float(np.percentile(times, 95)) if times.size else None,
            scoring_busy=self._scoring_wall_s / interval,
            cpu_s=max(0.0, self._cpu() - self._cpu_start),
            scoring_cpu_s=self.scoring_cpu_s,
            predictions=predictions,
            energy_j=None if self._rapl is None else self._rapl.joules(),
        )
        self._since = now
        self._last = (readings, windows, predictions)
        self._scoring_ms.clear()
        self._scoring_wall_s = 0.0
        return flow
