"""The fleet engine: every machine's life advanced chunk by chunk, with its telemetry rendered per chunk.

Time is cut into fixed chunks of samples counted from ``config.start`` (512 to 4096 samples: a day or more).
A chunk's noise comes from a random stream keyed by (seed, machine, chunk), and a machine's life is advanced in event
order, so any consumer that walks the chunks (batch, file writer or live stream) sees exactly the same readings and
events.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from precursor.simulator.config import FleetConfig
from precursor.simulator.physics import SENSORS, MachineProfile, controller_errors, machine_profile, render
from precursor.simulator.timeline import Episode, MachineLife, Outcome

MIN_CHUNK_SAMPLES = 512
MAX_CHUNK_SAMPLES = 4096
CHUNK_SPAN_S = 86_400


def chunk_samples(config: FleetConfig) -> int:
    """Samples per machine per chunk: a day's worth, at least enough to amortise the per-chunk work, capped so a
    chunk stays small at fine intervals."""
    return min(MAX_CHUNK_SAMPLES, max(MIN_CHUNK_SAMPLES, round(CHUNK_SPAN_S / config.interval_s)))


@dataclass(frozen=True)
class MachineChunk:
    """One machine's readings and events over one chunk. No readings while the machine is down for repair."""

    machine: int
    timestamps: np.ndarray  # (n,) int64 epoch seconds
    values: np.ndarray  # (n, len(SENSORS)) float64, NaN = missing, columns in SENSORS order
    events: list[tuple[int, str]]  # (epoch seconds, generic event text), time order


@dataclass(frozen=True)
class FleetChunk:
    index: int
    start: int
    end: int
    """Epoch seconds: the chunk covers [start, end)."""
    machines: list[MachineChunk]


@dataclass(frozen=True)
class Degradation:
    """Ground truth about one degradation episode, for evaluating predictors (never part of the generic inputs).

    ``warning_h`` is the planned time from onset to failure (for a false alarm: from onset to its peak).
    ``end`` is when it stopped, or None where it was still under way when the simulation ended.
    """

    machine_id: str
    kind: str
    onset: datetime
    end: datetime | None
    outcome: Outcome
    bound_for_failure: bool
    warning_h: float


def _degradation(machine_id: str, episode: Episode) -> Degradation:
    return Degradation(
        machine_id=machine_id,
        kind=episode.kind,
        onset=datetime.fromtimestamp(math.floor(episode.onset), UTC),
        end=None if episode.stop is None else datetime.fromtimestamp(math.floor(episode.stop), UTC),
        outcome=episode.outcome,
        bound_for_failure=episode.bound_for_failure,
        warning_h=round(episode.rise_s / 3600.0, 3),
    )


class FleetEngine:
    """Walks a fleet through time, one chunk at a time. Single use: lives only move forward."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.profiles: list[MachineProfile] = [
            machine_profile(i, machine_id, start_year=config.start.year, seed=config.seed)
            for i, machine_id in enumerate(config.machine_ids)
        ]
        self.lives = [MachineLife.begin(profile, config) for profile in self.profiles]
        self.samples_per_chunk = chunk_samples(config)

    def chunks(self, *, render_from: int | None = None, remember: bool = True) -> Iterator[FleetChunk]:
        """Every chunk in time order. Chunks ending at or before ``render_from`` (epoch seconds) only advance the
        machines' lives (nothing is rendered). ``remember=False`` forgets finished episodes as it goes, for
        endless runs."""
        config = self.config
        interval = config.interval_s
        total = config.samples_per_machine
        run_end = None if config.duration is None else config.start_s + config.duration.total_seconds()
        for index in itertools.count():
            first = index * self.samples_per_chunk
            if total is not None and first >= total:
                return
            last = first + self.samples_per_chunk if total is None else min(first + self.samples_per_chunk, total)
            start = config.start_s + first * interval
            end = config.start_s + last * interval
            if run_end is not None:
                end = min(end, math.ceil(run_end))
            timestamps = config.start_s + np.arange(first, last, dtype=np.int64) * interval
            skip = render_from is not None and end <= render_from
            machines = [self._machine_chunk(i, index, start, end, timestamps, skip) for i in range(len(self.lives))]
            if not remember:
                for life in self.lives:
                    life.forget_before(start)
            if not skip:
                yield FleetChunk(index, start, end, machines)

    def _machine_chunk(
        self, machine: int, index: int, start: int, end: int, timestamps: np.ndarray, skip: bool
    ) -> MachineChunk:
        config = self.config
        life = self.lives[machine]
        life.advance_to(end)
        logged = [(math.floor(at), event) for at, event in life.take_events(end)]
        if skip:
            return MachineChunk(machine, timestamps[:0], np.empty((0, len(SENSORS))), logged)
        t = timestamps.astype(np.float64)
        up = np.ones(len(t), dtype=bool)
        for downtime in life.downtimes:
            if downtime.start < end and downtime.end > start:
                up &= (t < downtime.start) | (t >= downtime.end)
        t = t[up]
        severity: dict[str, np.ndarray] = {}
        for episode in life.episodes:
            if episode.onset < end and episode.end > start:
                level = episode.severity(t)
                severity[episode.kind] = severity[episode.kind] + level if episode.kind in severity else level
        upset = np.zeros(len(t))
        for disturbance in life.upsets:
            if disturbance.start < end and disturbance.start + disturbance.duration_s > start:
                upset += disturbance.magnitude_at(t)
        rng = np.random.default_rng([config.seed, machine, 2, index])
        shown = severity
        if config.sensor_signature != 1.0:  # what the sensors show of it; the controller still sees it all
            shown = {kind: level * config.sensor_signature for kind, level in severity.items()}
        values = render(self.profiles[machine], t, shown, upset, rng, noise=config.noise)
        if config.missing_rate > 0:
            values[rng.random(values.shape) < config.missing_rate] = np.nan
        stamps = timestamps[up]
        errors = controller_errors(
            t,
            config.interval_s,
            severity,
            config.failure_kinds,
            config.background_errors_per_h,
            rng,
            rate_scale=config.error_rate_scale / config.time_scale,  # a fault built up in minutes errs per minute
            burst=config.error_burst,
        )
        events = logged + [(int(stamps[row]), f"error:{code}") for row, code in errors]
        events.sort(key=lambda item: item[0])  # stable: logged events keep their order within a second
        return MachineChunk(machine, stamps, values, events)

    def degradations(self) -> list[Degradation]:
        """Ground truth of every degradation so far, by onset."""
        found = [
            _degradation(profile.machine_id, episode)
            for profile, life in zip(self.profiles, self.lives, strict=True)
            for episode in life.episodes
        ]
        return sorted(found, key=lambda d: (d.onset, d.machine_id, d.kind))
