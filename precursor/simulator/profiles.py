"""Named kinds of fleet: how fast machines fail, how often they report, and what announces a failure.

A profile is a preset of :class:`~precursor.simulator.config.FleetConfig` fields; fields given explicitly win over it.
The
profiles differ where real fleets differ, so a model judged on all of them is not judged on one fleet's habits:

- ``slow-degradation``: the simulator's own defaults. Parts wear over days, each failure kind with its sensor
  signature; error codes and maintenance add context.
- ``error-codes``: sensors drift only faintly before a failure; what announces it is bursts of the failing part's
  error codes and the part's age since its last maintenance.
- ``server-metrics``: minute readings, faults that build up in under an hour, frequent short anomaly bursts that lead
  nowhere; for horizons under an hour. (The sensor columns keep their pump names.)
- ``daily``: one reading a day, faults that build up over days to weeks, so a window holds only a few points.

>>> sorted(PROFILES)
['daily', 'error-codes', 'server-metrics', 'slow-degradation']
>>> PROFILES["server-metrics"].fields["interval"]
'1m'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FleetProfile:
    name: str
    description: str
    fields: Mapping[str, object] = field(default_factory=dict)
    """FleetConfig fields this profile sets (durations as text: ``"30m"``, ``"7d"``)."""


PROFILES: Mapping[str, FleetProfile] = {
    p.name: p
    for p in (
        FleetProfile("slow-degradation", "parts wear over days, each failure kind with its own sensor signature"),
        FleetProfile(
            "error-codes",
            "faint sensor drift; failures announced by bursts of the part's error codes and by the part's age",
            {
                "interval": "30m",
                "sensor_signature": 0.08,
                "error_rate_scale": 3.0,
                "error_burst": 3.0,
                "maintenance_interval": "5d",
                "mtbf": "8d",
            },
        ),
        FleetProfile(
            "server-metrics",
            "minute readings, faults that build up in under an hour, frequent short anomaly bursts",
            {
                "interval": "1m",
                "time_scale": 1 / 48,
                "mtbf": "12h",
                "maintenance_interval": "1d",
                "upsets_per_day": 8.0,
                "background_errors_per_h": 0.2,
            },
        ),
        FleetProfile(
            "daily",
            "one reading a day, faults that build up over days to weeks",
            {
                "interval": "1d",
                "time_scale": 8.0,
                "mtbf": "90d",
                "maintenance_interval": "60d",
                "background_errors_per_h": 0.005,
                "upsets_per_day": 0.05,
            },
        ),
    )
}
"""Every profile, by name."""


def profile_fields(name: str) -> Mapping[str, object]:
    """The FleetConfig fields of profile ``name``; a clear error naming the known ones for any other."""
    try:
        return PROFILES[name].fields
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
