"""The life of one machine as a discrete-event simulation: wear, degradation, maintenance, failure and repair.

Each failure kind wears one part. A part's hazard grows with the time since it was last serviced, so routine
maintenance lowers it; onsets are drawn by thinning a Poisson process at the hazard's ceiling. An onset starts a
degradation episode whose severity ramps from 0 to 1 over a lead time of hours to days (or, for a sudden failure, under
three hours), times ``config.time_scale``; at 1 the machine fails, goes down for repair and comes back healthy. A
maintenance visit services each
part with a probability that grows with its age and with how visibly it is degrading, which stops a degradation under
way (the failure is prevented). False alarms are degradations that peak part-way and recover on their own.
Process upsets are short disturbances unrelated to wear; operators log some of them, and some real degradations,
as ``anomaly``.

The life advances lazily: :meth:`MachineLife.advance_to` processes everything before a given instant, so a stream can
run without end. All randomness comes from the machine's own stream, consumed in event order, so the life does not
depend on how far ahead anyone asks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from precursor.simulator.config import FleetConfig
from precursor.simulator.physics import FAILURE_KINDS, PARTS, MachineProfile

HOUR_S = 3600.0
HAZARD_CEILING = 2.5
"""The age factor of a part's hazard stops growing here (a neglected part is not infinitely fragile)."""
ANOMALY_REPORT_PROBABILITY = 0.35
"""Chance that operators log an ``anomaly`` when a degradation gets halfway to failure."""
UPSET_REPORT_PROBABILITY = 0.4

Outcome = Literal["failure", "prevented", "recovered", "serviced", "repaired", "ongoing"]


@dataclass
class Episode:
    """One degradation of one failure kind. Times are epoch seconds.

    ``peak`` is 1 for a degradation that ends in failure at ``onset + rise_s`` unless maintenance or a repair stops it
    first; a false alarm peaks below 1 and recovers linearly over ``decay_s``. ``stop`` is set when it ends.
    """

    kind: str
    onset: float
    rise_s: float
    shape: float
    peak: float
    decay_s: float = 0.0
    stop: float | None = None
    outcome: Outcome = "ongoing"

    @property
    def bound_for_failure(self) -> bool:
        return self.peak >= 1.0

    @property
    def natural_end(self) -> float:
        return self.onset + self.rise_s + self.decay_s

    @property
    def end(self) -> float:
        return self.stop if self.stop is not None else self.natural_end

    def severity(self, t: np.ndarray) -> np.ndarray:
        """Severity at each instant of ``t`` (0 outside the episode)."""
        elapsed = t - self.onset
        rising = self.peak * np.clip(elapsed / self.rise_s, 0.0, 1.0) ** self.shape
        if self.decay_s > 0:
            rising = np.where(elapsed > self.rise_s, self.peak * (1.0 - (elapsed - self.rise_s) / self.decay_s), rising)
        return np.where((elapsed >= 0) & (t < self.end), np.maximum(rising, 0.0), 0.0)

    def severity_at(self, t: float) -> float:
        return float(self.severity(np.array([t]))[0])

    def time_to_reach(self, level: float) -> float | None:
        """When the rising ramp first reaches ``level``; None if it never does."""
        if level > self.peak:
            return None
        return self.onset + self.rise_s * (level / self.peak) ** (1.0 / self.shape)


@dataclass(frozen=True)
class Downtime:
    start: float
    end: float
    kind: str


@dataclass(frozen=True)
class Upset:
    start: float
    duration_s: float
    magnitude: float

    def magnitude_at(self, t: np.ndarray) -> np.ndarray:
        """A smooth bump: the valve closes and reopens over the upset."""
        phase = (t - self.start) / self.duration_s
        inside = (phase >= 0) & (phase < 1)
        return np.where(inside, self.magnitude * np.sin(np.pi * np.clip(phase, 0, 1)), 0.0)


Action = Literal["onset", "false_onset", "maintenance", "fail", "recover", "repaired", "upset", "report"]


@dataclass
class MachineLife:
    """The events and hidden state of one machine, simulated up to :attr:`horizon` (epoch seconds)."""

    profile: MachineProfile
    config: FleetConfig
    rng: np.random.Generator
    horizon: float
    episodes: list[Episode] = field(default_factory=list)
    downtimes: list[Downtime] = field(default_factory=list)
    upsets: list[Upset] = field(default_factory=list)
    events: deque[tuple[float, str]] = field(default_factory=deque)
    """Logged events not yet taken, (epoch seconds, generic event text), in time order."""
    serviced_at: dict[str, float] = field(default_factory=dict)
    active: dict[str, Episode] = field(default_factory=dict)
    down_until: float | None = None
    _queue: list[tuple[float, int, Action, object]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def begin(cls, profile: MachineProfile, config: FleetConfig) -> MachineLife:
        start = float(config.start_s)
        life = cls(profile, config, np.random.default_rng([config.seed, profile.index, 1]), start)
        wear_span = life._reference_interval * 1.5
        for part in PARTS:  # machines join the simulation mid-life, with parts of different ages
            life.serviced_at[part] = start - float(life.rng.uniform(0.0, wear_span))
        for kind in config.failure_kinds:
            life._schedule(start + life._wait(life._onset_ceiling(kind)), "onset", kind)
            if config.false_alarm_ratio > 0:
                life._schedule(start + life._wait(life._false_alarm_rate(kind)), "false_onset", kind)
        if config.maintenance_interval is not None:
            life._schedule(start + float(life.rng.uniform(0.0, 1.0)) * life._reference_interval, "maintenance", None)
        if config.upsets_per_day > 0:
            life._schedule(start + life._wait(config.upsets_per_day / 86_400.0), "upset", None)
        return life

    # -- rates ---------------------------------------------------------------------------------------------------

    @property
    def _reference_interval(self) -> float:
        interval = self.config.maintenance_interval
        return interval.total_seconds() if interval is not None else 7 * 86_400.0

    def _base_rate(self, kind: str) -> float:
        """Onsets per second for a part of average age: the fleet's MTBF shared out by the kinds' weights."""
        total_weight = sum(FAILURE_KINDS[k].weight for k in self.config.failure_kinds)
        share = FAILURE_KINDS[kind].weight / total_weight
        return share * self.profile.kind_factor[kind] / self.config.mtbf.total_seconds()

    def _age_factor(self, kind: str, now: float) -> float:
        age = now - self.serviced_at[FAILURE_KINDS[kind].part]
        return min(HAZARD_CEILING, 0.4 + 0.8 * age / self._reference_interval)

    def _onset_ceiling(self, kind: str) -> float:
        return self._base_rate(kind) * HAZARD_CEILING

    def _false_alarm_rate(self, kind: str) -> float:
        return self._base_rate(kind) * self.config.false_alarm_ratio

    def _wait(self, rate_per_s: float) -> float:
        return float(self.rng.exponential(1.0 / rate_per_s)) if rate_per_s > 0 else math.inf

    # -- the event loop ------------------------------------------------------------------------------------------

    def _schedule(self, at: float, action: Action, payload: object) -> None:
        if math.isfinite(at):
            heapq.heappush(self._queue, (at, next(self._order), action, payload))

    def _log(self, at: float, event: str) -> None:
        self.events.append((at, event))

    def advance_to(self, until: float) -> None:
        """Process everything that happens before ``until``."""
        while self._queue and self._queue[0][0] < until:
            at, _, action, payload = heapq.heappop(self._queue)
            getattr(self, f"_on_{action}")(at, payload)
        self.horizon = max(self.horizon, until)

    def _is_down(self, at: float) -> bool:
        return self.down_until is not None and at < self.down_until

    def _on_onset(self, at: float, kind: object) -> None:
        assert isinstance(kind, str)
        self._schedule(at + self._wait(self._onset_ceiling(kind)), "onset", kind)
        accepted = self.rng.random() < self._age_factor(kind, at) / HAZARD_CEILING
        if not accepted or self._is_down(at) or kind in self.active:
            return
        spec = FAILURE_KINDS[kind]
        scale = self.config.time_scale
        if self.rng.random() < self.config.sudden_fraction:
            rise_h = float(self.rng.uniform(0.5, 3.0)) * scale
        else:
            lead_h = spec.lead_median_h * scale * self.rng.lognormal(0.0, spec.lead_sigma)
            rise_h = float(np.clip(lead_h, 2.0 * scale, 240.0 * scale))
        episode = Episode(kind, at, rise_h * HOUR_S, float(self.rng.uniform(*spec.shape)), 1.0)
        self._start(episode)
        self._schedule(episode.onset + episode.rise_s, "fail", episode)

    def _on_false_onset(self, at: float, kind: object) -> None:
        assert isinstance(kind, str)
        self._schedule(at + self._wait(self._false_alarm_rate(kind)), "false_onset", kind)
        if self._is_down(at) or kind in self.active:
            return
        spec = FAILURE_KINDS[kind]
        scale = self.config.time_scale
        lead_h = 0.6 * spec.lead_median_h * scale * self.rng.lognormal(0.0, spec.lead_sigma)
        rise_s = float(np.clip(lead_h, 1.0 * scale, 120.0 * scale)) * HOUR_S
        episode = Episode(
            kind,
            at,
            rise_s,
            float(self.rng.uniform(*spec.shape)),
            peak=float(self.rng.uniform(0.25, 0.75)),
            decay_s=rise_s * float(self.rng.uniform(0.3, 1.0)),
        )
        self._start(episode)
        self._schedule(episode.natural_end, "recover", episode)

    def _start(self, episode: Episode) -> None:
        self.active[episode.kind] = episode
        self.episodes.append(episode)
        halfway = episode.time_to_reach(0.5)
        if halfway is not None and self.rng.random() < ANOMALY_REPORT_PROBABILITY:
            self._schedule(halfway, "report", episode)

    def _stop(self, episode: Episode, at: float, outcome: Outcome) -> None:
        episode.stop = at
        episode.outcome = outcome
        if self.active.get(episode.kind) is episode:
            del self.active[episode.kind]

    def _on_report(self, at: float, episode: object) -> None:
        if episode is None or (isinstance(episode, Episode) and episode.stop is None):
            self._log(at, "anomaly")

    def _on_recover(self, at: float, episode: object) -> None:
        assert isinstance(episode, Episode)
        if episode.stop is None:
            self._stop(episode, at, "recovered")

    def _on_fail(self, at: float, episode: object) -> None:
        assert isinstance(episode, Episode)
        if episode.stop is not None:
            return
        self._stop(episode, at, "failure")
        self._log(at, f"failure:{episode.kind}")
        spec = FAILURE_KINDS[episode.kind]
        scale = self.config.time_scale
        repair_h = spec.repair_median_h * scale * self.rng.lognormal(0.0, 0.5)
        repair_s = float(np.clip(repair_h, 0.5 * scale, 72.0 * scale)) * HOUR_S
        end = at + repair_s
        self.downtimes.append(Downtime(at, end, episode.kind))
        self.down_until = end
        parts = [spec.part]
        for other in list(self.active.values()):  # the repair crew fixes whatever else is visibly wrong
            self._stop(other, at, "repaired")
            parts.append(FAILURE_KINDS[other.kind].part)
        self._schedule(end, "repaired", tuple(dict.fromkeys(parts)))

    def _on_repaired(self, at: float, parts: object) -> None:
        assert isinstance(parts, tuple)
        for part in parts:
            self.serviced_at[part] = at
            self._log(at, f"maintenance:{part}")
        self.down_until = None

    def _on_maintenance(self, at: float, _: object) -> None:
        interval = self._reference_interval
        if self._is_down(at):
            assert self.down_until is not None
            self._schedule(self.down_until + HOUR_S, "maintenance", None)
            return
        self._schedule(at + interval * float(self.rng.uniform(0.8, 1.2)), "maintenance", None)
        degrading = {FAILURE_KINDS[e.kind].part: e for e in self.active.values()}
        for part in PARTS:
            age = at - self.serviced_at[part]
            episode = degrading.get(part)
            visible = episode.severity_at(at) if episode is not None else 0.0
            chance = min(0.95, 0.1 + 0.5 * min(1.0, age / (3 * interval)) + 2.0 * visible)
            if self.rng.random() >= chance:
                continue
            self.serviced_at[part] = at
            self._log(at, f"maintenance:{part}")
            if episode is not None:
                self._stop(episode, at, "prevented" if episode.bound_for_failure else "serviced")

    def _on_upset(self, at: float, _: object) -> None:
        self._schedule(at + self._wait(self.config.upsets_per_day / 86_400.0), "upset", None)
        if self._is_down(at):
            return
        upset = Upset(at, float(self.rng.uniform(10.0, 60.0)) * 60.0, float(self.rng.uniform(0.3, 1.0)))
        self.upsets.append(upset)
        if self.rng.random() < UPSET_REPORT_PROBABILITY:
            self._schedule(at + float(self.rng.uniform(0.2, 0.8)) * upset.duration_s, "report", None)

    # -- what the telemetry renderer needs -----------------------------------------------------------------------

    def take_events(self, until: float) -> list[tuple[float, str]]:
        """Logged events before ``until``, removed from the queue."""
        taken: list[tuple[float, str]] = []
        while self.events and self.events[0][0] < until:
            taken.append(self.events.popleft())
        return taken

    def forget_before(self, at: float) -> None:
        """Drop episodes, downtimes and upsets that ended before ``at``: an endless stream keeps bounded memory."""
        self.episodes = [e for e in self.episodes if e.stop is None or e.stop >= at]
        self.downtimes = [d for d in self.downtimes if d.end >= at]
        self.upsets = [u for u in self.upsets if u.start + u.duration_s >= at]
