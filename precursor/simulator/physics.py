"""The physics of one simulated machine: what its sensors read, given its load, its site and how worn it is.

A machine is a motor-driven rotating machine (pump, fan or compressor) with seven sensors. Each reading is built from
the operating point (a daily and weekly load cycle plus slow process wander), the site's ambient temperature, the
machine's own offsets, measurement noise, short process upsets and, where a part is degrading, that failure kind's
signature:

- ``bearing``: vibration rises first; bearing temperature follows once the damage is well along.
- ``overheat``: the cooling degrades, so winding temperature drifts up with current and swings harder with load.
- ``seal_leak``: discharge pressure drops and flow is lost; pressure gets noisier.
- ``electrical``: current spikes, more often as the fault grows, and a little extra winding heat.
- ``clog``: flow falls while pressure rises and current drops, like a throttled valve (which process upsets also are).

Severity runs from 0 (healthy) to 1 (the moment of failure). The machine's controller raises error codes at a rate
that grows with severity, on top of a background of unrelated codes.

Temperatures lag the load with first-order thermal time constants. The load is a sum of sinusoids, so the lagged
response has a closed form (gain ``1/sqrt(1 + (w tau)^2)``, phase ``atan(w tau)``) and any stretch of time can be
rendered on its own, without running a filter from the start.

>>> profile = machine_profile(0, "m-001", start_year=2026)
>>> t = np.arange(0, 86400, 600, dtype=np.float64) + 1_767_225_600
>>> values = render(profile, t, {}, np.zeros_like(t), np.random.default_rng(0), noise=1.0)
>>> values.shape
(144, 7)
>>> bool(np.all(values[:, SENSORS.index("rpm")] > 0))
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

SENSORS: tuple[str, ...] = (
    "rpm",
    "motor_current",
    "vibration_rms",
    "bearing_temp",
    "winding_temp",
    "pressure",
    "flow",
)
"""Sensor columns, in the order every array here uses. Units: 1/min, A, mm/s, degC, degC, bar, m3/h."""

DECIMALS: Mapping[str, int] = {
    "rpm": 1,
    "motor_current": 2,
    "vibration_rms": 3,
    "bearing_temp": 2,
    "winding_temp": 2,
    "pressure": 3,
    "flow": 2,
}
"""The resolution each sensor reports at; values are rounded to it so files round-trip exactly."""

GENERIC_ERROR_CODES: tuple[str, ...] = ("E001", "E002", "E003")
"""Codes that say nothing about failures: a sensor self-check, a fieldbus retry, a door switch."""

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True)
class FailureKind:
    """One way a machine fails: the part that wears out, how long it degrades first, and what it looks like."""

    name: str
    part: str
    error_codes: tuple[str, ...]
    lead_median_h: float
    """Median hours from onset of degradation to failure (lognormal, ``lead_sigma``)."""
    lead_sigma: float
    shape: tuple[float, float]
    """Range of the exponent of the severity ramp ``((t - onset) / lead) ** shape``: above 1 is slow then fast."""
    repair_median_h: float
    weight: float
    """Relative frequency among the enabled kinds."""
    error_rate_at_failure_per_h: float
    """Controller error codes per hour at severity 1; the rate grows with severity squared."""


FAILURE_KINDS: Mapping[str, FailureKind] = {
    kind.name: kind
    for kind in (
        FailureKind("bearing", "bearing", ("E110", "E111"), 48.0, 0.5, (1.6, 2.6), 10.0, 1.3, 1.5),
        FailureKind("overheat", "cooling", ("E210", "E211"), 24.0, 0.5, (1.2, 2.0), 5.0, 1.0, 2.0),
        FailureKind("seal_leak", "seal", ("E310", "E311"), 30.0, 0.6, (1.0, 1.6), 8.0, 1.0, 1.5),
        FailureKind("electrical", "contactor", ("E410", "E411", "E412"), 14.0, 0.6, (1.5, 3.0), 4.0, 0.8, 4.0),
        FailureKind("clog", "filter", ("E510", "E511"), 24.0, 0.5, (1.0, 1.8), 3.0, 0.9, 1.5),
    )
}
"""Every failure kind the simulator knows, by name."""

PARTS: tuple[str, ...] = tuple(dict.fromkeys(kind.part for kind in FAILURE_KINDS.values()))
"""Maintainable parts; a maintenance event names one of them."""


@dataclass(frozen=True)
class MachineModel:
    """A product line: nominal operating values and how prone it is to each failure kind."""

    name: str
    rpm: float
    current_a: float
    vibration_mm_s: float
    pressure_bar: float
    flow_m3_h: float
    winding_rise_c: float
    bearing_rise_c: float
    kind_factor: Mapping[str, float]


MACHINE_MODELS: tuple[MachineModel, ...] = (
    MachineModel("PX-100", 1480, 22.0, 1.8, 4.0, 60.0, 45.0, 22.0, {"seal_leak": 1.4, "clog": 1.3}),
    MachineModel("PX-250", 2960, 48.0, 2.4, 8.5, 140.0, 55.0, 28.0, {"bearing": 1.3}),
    MachineModel("CX-400", 3550, 85.0, 3.1, 11.0, 320.0, 62.0, 34.0, {"overheat": 1.5, "electrical": 1.3}),
)

SITES: Mapping[str, float] = {"plant-north": 11.0, "plant-coast": 17.0, "plant-south": 26.0}
"""Site name -> mean ambient temperature in degC."""


@dataclass(frozen=True)
class LoadCycle:
    """Relative load ``base + sum(amp * cos(omega * t + phase))`` with ``t`` in epoch seconds."""

    base: float
    amps: tuple[float, ...]
    omegas: tuple[float, ...]
    phases: tuple[float, ...]

    def at(self, t: np.ndarray, lag_s: float = 0.0) -> np.ndarray:
        """The load at ``t``, or as seen through a first-order lag with time constant ``lag_s``."""
        out = np.full(t.shape, self.base)
        for amp, omega, phase in zip(self.amps, self.omegas, self.phases, strict=True):
            gain = 1.0 / math.sqrt(1.0 + (omega * lag_s) ** 2)
            out += amp * gain * np.cos(omega * t + phase - math.atan(omega * lag_s))
        return out


@dataclass(frozen=True)
class MachineProfile:
    """Everything static about one machine: its attributes, nominal values, offsets, load cycle and frailty."""

    index: int
    machine_id: str
    model: MachineModel
    site: str
    install_year: int
    age_years: int
    nominal: Mapping[str, float]
    """rpm, motor_current, vibration_rms, pressure and flow at full load, with this unit's own deviation."""
    ambient_c: float
    winding_rise_c: float
    bearing_rise_c: float
    bearing_offset_c: float
    winding_offset_c: float
    noise_scale: float
    load: LoadCycle
    winding_tau_s: float
    bearing_tau_s: float
    kind_factor: Mapping[str, float]
    """Hazard multiplier per failure kind: the model's proneness, the unit's age and its own luck."""

    def attributes(self) -> dict[str, str]:
        """Static attributes as the generic machines format carries them."""
        return {
            "model": self.model.name,
            "site": self.site,
            "install_year": str(self.install_year),
            "age_years": str(self.age_years),
            "rated_rpm": f"{self.model.rpm:g}",
        }


def machine_profile(index: int, machine_id: str, *, start_year: int, seed: int = 0) -> MachineProfile:
    """The profile of machine ``index``, drawn from its own random stream: a larger fleet keeps its first machines."""
    rng = np.random.default_rng([seed, index, 0])
    model = MACHINE_MODELS[int(rng.integers(len(MACHINE_MODELS)))]
    site = tuple(SITES)[int(rng.integers(len(SITES)))]
    age = int(rng.integers(0, 16))

    def unit(nominal: float) -> float:
        return float(nominal * (1.0 + rng.normal(0.0, 0.04)))

    nominal = {
        "rpm": unit(model.rpm),
        "motor_current": unit(model.current_a),
        "vibration_rms": unit(model.vibration_mm_s) * (1.0 + 0.02 * age),
        "pressure": unit(model.pressure_bar),
        "flow": unit(model.flow_m3_h),
    }
    peak_hour = rng.uniform(10.0, 17.0)
    omega_day = 2 * math.pi / DAY_S
    omega_week = 2 * math.pi / WEEK_S
    # Epoch second 0 is a Thursday midnight: a weekly cosine peaking 6.5 days later has its trough on Sunday 00:00.
    amps = [rng.uniform(0.08, 0.2), rng.uniform(0.0, 0.05), rng.uniform(0.02, 0.08)]
    omegas = [omega_day, 2 * omega_day, omega_week]
    phases = [-omega_day * peak_hour * 3600, rng.uniform(0, 2 * math.pi), -omega_week * 6.5 * DAY_S]
    for _ in range(3):  # slow process wander, hours to a day and a half
        amps.append(rng.uniform(0.005, 0.02))
        omegas.append(2 * math.pi / (rng.uniform(2.0, 36.0) * 3600))
        phases.append(rng.uniform(0, 2 * math.pi))
    load = LoadCycle(float(rng.uniform(0.6, 0.75)), tuple(amps), tuple(omegas), tuple(phases))
    age_factor = 1.0 + 0.04 * age
    kind_factor = {
        name: float(model.kind_factor.get(name, 1.0) * age_factor * rng.lognormal(0.0, 0.3)) for name in FAILURE_KINDS
    }
    return MachineProfile(
        index=index,
        machine_id=machine_id,
        model=model,
        site=site,
        install_year=start_year - age,
        age_years=age,
        nominal=nominal,
        ambient_c=SITES[site] + float(rng.normal(0.0, 1.5)),
        winding_rise_c=model.winding_rise_c * float(rng.uniform(0.9, 1.1)),
        bearing_rise_c=model.bearing_rise_c * float(rng.uniform(0.9, 1.1)),
        bearing_offset_c=float(rng.normal(0.0, 1.5)),
        winding_offset_c=float(rng.normal(0.0, 2.0)),
        noise_scale=float(rng.uniform(0.7, 1.3)),
        load=load,
        winding_tau_s=float(rng.uniform(20, 40) * 60),
        bearing_tau_s=float(rng.uniform(40, 90) * 60),
        kind_factor=kind_factor,
    )


def render(
    profile: MachineProfile,
    t: np.ndarray,
    severity: Mapping[str, np.ndarray],
    upset: np.ndarray,
    rng: np.random.Generator,
    *,
    noise: float,
) -> np.ndarray:
    """Sensor readings at epoch seconds ``t``: shape (len(t), len(SENSORS)), rounded to each sensor's resolution.

    ``severity[kind]`` is that kind's degradation at each instant (0..1; absent means healthy); ``upset`` is the
    magnitude of a process upset (a throttled valve) at each instant, 0 where there is none.
    """
    n = len(t)
    zero = np.zeros(n)
    sb, so, ss, se, sc = (severity.get(k, zero) for k in ("bearing", "overheat", "seal_leak", "electrical", "clog"))
    nom = profile.nominal
    sigma = noise * profile.noise_scale
    load = profile.load.at(t)  # (n,)
    load_winding = profile.load.at(t, profile.winding_tau_s)
    load_bearing = profile.load.at(t, profile.bearing_tau_s)
    ambient = profile.ambient_c + 4.0 * np.cos(2 * math.pi / DAY_S * (t - 15 * 3600.0))

    speed = 0.82 + 0.18 * load  # variable-speed drive: relative rpm follows demand
    spikes = rng.random(n) < 0.001 + 0.25 * se**1.5
    spike_size = np.where(spikes, rng.uniform(0.15, 0.6, n), 0.0)
    rpm = nom["rpm"] * speed * (1.0 - 0.02 * spike_size) * (1.0 + rng.normal(0.0, 0.002 * sigma, n))

    flow = nom["flow"] * (0.25 + 0.75 * load) * (1.0 - 0.22 * ss - 0.4 * sc) * (1.0 - 0.35 * upset)
    flow *= 1.0 + rng.normal(0.0, 0.015 * sigma, n)

    pressure = nom["pressure"] * (0.4 + 0.6 * speed**2) * (1.0 - 0.28 * ss + 0.2 * sc) * (1.0 + 0.15 * upset)
    pressure *= 1.0 + rng.normal(0.0, 0.01 * sigma, n) * (1.0 + 2.0 * ss)

    current = nom["motor_current"] * (0.3 + 0.7 * load) * (1.0 + 0.05 * sb + 0.12 * so - 0.07 * sc - 0.08 * upset)
    current *= (1.0 + spike_size) * (1.0 + rng.normal(0.0, 0.012 * sigma, n) * (1.0 + 2.0 * se))

    vibration = nom["vibration_rms"] * (0.6 + 0.4 * speed**2) * (1.0 + 1.8 * sb + 0.35 * sc + 0.15 * upset)
    vibration *= np.exp(rng.normal(0.0, 0.06 * sigma, n) * (1.0 + 1.5 * sb))

    winding_current = 0.3 + 0.7 * load_winding
    winding = ambient + profile.winding_rise_c * winding_current**2 * (1.0 + 0.5 * so) + 28.0 * so + 4.0 * se
    winding += profile.winding_offset_c + rng.normal(0.0, 0.3 * sigma, n)

    bearing_damage_heat = np.clip((sb - 0.35) / 0.65, 0.0, 1.0) ** 1.5  # heat comes only once damage is well along
    bearing = ambient + profile.bearing_rise_c * (0.5 + 0.5 * load_bearing) + 25.0 * bearing_damage_heat + 7.0 * so
    bearing += profile.bearing_offset_c + rng.normal(0.0, 0.3 * sigma, n)

    columns = {
        "rpm": rpm,
        "motor_current": current,
        "vibration_rms": vibration,
        "bearing_temp": bearing,
        "winding_temp": winding,
        "pressure": pressure,
        "flow": flow,
    }
    out = np.empty((n, len(SENSORS)))
    for j, name in enumerate(SENSORS):
        column = columns[name]
        if name not in ("bearing_temp", "winding_temp"):
            column = np.maximum(column, 0.0)
        out[:, j] = np.round(column, DECIMALS[name])
    return out


def controller_errors(
    t: np.ndarray,
    interval_s: float,
    severity: Mapping[str, np.ndarray],
    kinds: tuple[str, ...],
    background_per_h: float,
    rng: np.random.Generator,
    *,
    rate_scale: float = 1.0,
    burst: float = 0.0,
) -> list[tuple[int, str]]:
    """Error codes the controller raises at the sample instants ``t``, as (row, code) pairs.

    Each degrading kind raises its own codes at ``rate * rate_scale * severity**2`` per hour; a background of
    unrelated codes (generic ones and, less often, the enabled kinds' own codes, as false alarms) runs underneath at
    ``background_per_h``. With ``burst``, each of a degrading kind's codes is followed by a Poisson(``burst``) number
    of further codes of that kind within the next ten minutes (at least the next sample), as a struggling controller
    retries and logs again.
    """
    n = len(t)
    hours = interval_s / 3600.0
    errors: list[tuple[int, str]] = []
    background_codes = GENERIC_ERROR_CODES + tuple(c for k in kinds for c in FAILURE_KINDS[k].error_codes)
    weights = np.array([3.0 if c in GENERIC_ERROR_CODES else 1.0 for c in background_codes])
    hits = np.flatnonzero(rng.random(n) < -np.expm1(-background_per_h * hours))
    picks = rng.choice(len(background_codes), size=len(hits), p=weights / weights.sum())
    errors.extend((int(row), background_codes[int(pick)]) for row, pick in zip(hits, picks, strict=True))
    for kind in kinds:
        level = severity.get(kind)
        if level is None:
            continue
        spec = FAILURE_KINDS[kind]
        rate = spec.error_rate_at_failure_per_h * rate_scale * level**2
        hits = np.flatnonzero(rng.random(n) < -np.expm1(-rate * hours))
        if burst > 0 and len(hits):
            span = max(1, round(600.0 / interval_s))
            extra = rng.poisson(burst, size=len(hits))
            follow = np.repeat(hits, extra) + rng.integers(0, span + 1, size=int(extra.sum()))
            hits = np.sort(np.concatenate([hits, follow[follow < n]]))
        picks = rng.integers(len(spec.error_codes), size=len(hits))
        errors.extend((int(row), spec.error_codes[int(pick)]) for row, pick in zip(hits, picks, strict=True))
    errors.sort()
    return errors
