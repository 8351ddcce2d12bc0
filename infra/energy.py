"""What a stretch of work costs: CPU seconds, and energy from RAPL counters or, where they cannot be read, a stated
power model.

RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``, one counter per CPU package) measures the whole package, so
for one process it is an upper bound: whatever else ran on the package meanwhile is counted too. Most containers,
VMs and non-root users cannot read it (the counters are root-only since kernels patched against PLATYPUS); there
the estimate is ``CPU seconds x watts per busy core``, with the wattage a setting (``PRECURSOR_ENERGY_WATTS_PER_CORE``)
and named wherever a figure is shown, so nobody mistakes a model for a measurement.

>>> model = PowerModel(watts_per_core=12.0)
>>> model.joules(2.5), model.basis
(30.0, 'model: 12 W per busy core (PRECURSOR_ENERGY_WATTS_PER_CORE)')
>>> Rapl.open(Path("/nonexistent")) is None
True
>>> cost = Cost(cpu_s=3.0, predictions=1500, energy_j=45.0, energy_source="model", basis=model.basis)
>>> round(cost.cpu_s_per_1000, 3), round(cost.energy_j_per_1000, 3)
(2.0, 30.0)
"""

from __future__ import annotations

import os
import re
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")  # a package; intel-rapl:N:M are its parts (cores, dram), inside it
DEFAULT_WATTS_PER_CORE = 10.0
"""A busy server core, roughly: a 350 W, 32-core package at full load. An edge box's ARM core draws nearer 1-2 W;
set ``PRECURSOR_ENERGY_WATTS_PER_CORE`` for the hardware at hand."""

EnergySource = Literal["rapl", "model"]


class EnergySettings(BaseSettings):
    """``PRECURSOR_ENERGY_*``: the power model used where RAPL cannot be read, and where to look for RAPL."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_ENERGY_", extra="forbid")

    watts_per_core: Annotated[float, Field(gt=0, le=1000)] = DEFAULT_WATTS_PER_CORE
    powercap: Path = POWERCAP
    use_rapl: bool = Field(True, description="false: always the power model, even where RAPL is readable")

    def power_model(self) -> PowerModel:
        return PowerModel(watts_per_core=self.watts_per_core)

    def rapl(self) -> Rapl | None:
        return Rapl.open(self.powercap) if self.use_rapl else None


class PowerModel(BaseModel):
    """Energy estimated from CPU time: ``watts_per_core`` for each second a core is busy, nothing when idle."""

    model_config = ConfigDict(frozen=True)

    watts_per_core: Annotated[float, Field(gt=0, le=1000)] = DEFAULT_WATTS_PER_CORE

    def joules(self, cpu_s: float) -> float:
        return cpu_s * self.watts_per_core

    @property
    def basis(self) -> str:
        return f"model: {self.watts_per_core:g} W per busy core (PRECURSOR_ENERGY_WATTS_PER_CORE)"


class Rapl:
    """The packages' RAPL energy counters, summed, in joules since :meth:`open`; a counter that wraps (at its
    ``max_energy_range_uj``) is unwrapped, as long as it is read more often than it wraps (minutes at full power)."""

    basis = "RAPL: CPU package energy counters (the whole package, other work on it included)"

    def __init__(self, zones: list[Path]) -> None:
        self._zones = zones
        self._ranges = [_read_int(z / "max_energy_range_uj") or 2**32 for z in zones]
        self._last = [self._raw(i) for i in range(len(zones))]
        self._total_uj = 0

    @classmethod
    def open(cls, root: Path = POWERCAP) -> Rapl | None:
        """The readable package counters under ``root``; None where there are none (no RAPL, or no permission)."""
        try:
            zones = sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name))
        except OSError:
            return None
        readable = [z for z in zones if _read_int(z / "energy_uj") is not None]
        return cls(readable) if readable else None

    def _raw(self, i: int) -> int:
        value = _read_int(self._zones[i] / "energy_uj")
        return self._last[i] if value is None else value

    def joules(self) -> float:
        """Energy used by the packages since this counter was opened."""
        for i in range(len(self._zones)):
            now = self._raw(i)
            step = now - self._last[i]
            self._total_uj += step if step >= 0 else step + self._ranges[i]
            self._last[i] = now
        return self._total_uj / 1e6


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def process_cpu_s(*, children: bool = False) -> float:
    """CPU seconds (user and system, all threads) this process used, and with ``children`` its waited-for
    children's too (a Beam or Flink worker it started)."""
    used = time.process_time()
    if children:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        used += usage.ru_utime + usage.ru_stime
    return used


@dataclass(frozen=True)
class Cost:
    """CPU seconds and energy that produced ``predictions`` predictions (or handled that many records)."""

    cpu_s: float
    predictions: int
    energy_j: float
    energy_source: EnergySource
    basis: str
    wall_s: float | None = None

    @property
    def cpu_s_per_1000(self) -> float | None:
        return None if not self.predictions else 1000 * self.cpu_s / self.predictions

    @property
    def energy_j_per_1000(self) -> float | None:
        return None if not self.predictions else 1000 * self.energy_j / self.predictions


def estimate(cpu_s: float, predictions: int, *, energy_j: float | None = None, model: PowerModel | None = None) -> Cost:
    """A cost from CPU seconds, with the measured ``energy_j`` (RAPL) where there is one, else the power model's."""
    if energy_j is not None:
        return Cost(cpu_s, predictions, energy_j, "rapl", Rapl.basis)
    model = model or PowerModel()
    return Cost(cpu_s, predictions, model.joules(cpu_s), "model", model.basis)


@dataclass
class CostMeter:
    """Measures a stretch of work in this process: ``with CostMeter() as meter: ...``, or :meth:`start` and
    :meth:`stop` where the work has no block of its own; then ``meter.cost(n)``."""

    settings: EnergySettings = field(default_factory=EnergySettings)
    children: bool = False
    _rapl: Rapl | None = None
    _cpu0: float = 0.0
    _wall0: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    energy_j: float | None = None

    def start(self) -> CostMeter:
        self._rapl = self.settings.rapl()
        self._cpu0 = process_cpu_s(children=self.children)
        self._wall0 = time.monotonic()
        return self

    def stop(self) -> CostMeter:
        self.cpu_s = process_cpu_s(children=self.children) - self._cpu0
        self.wall_s = time.monotonic() - self._wall0
        self.energy_j = None if self._rapl is None else self._rapl.joules()
        return self

    def __enter__(self) -> CostMeter:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def cost(self, predictions: int) -> Cost:
        found = estimate(self.cpu_s, predictions, energy_j=self.energy_j, model=self.settings.power_model())
        return Cost(found.cpu_s, found.predictions, found.energy_j, found.energy_source, found.basis, self.wall_s)


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
