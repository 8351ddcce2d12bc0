"""A deterministic, physically plausible fleet simulator: telemetry, events and machines in the generic formats.

Machines degrade before they fail, each failure kind with its own signature in the sensors and its own error codes;
maintenance resets wear and prevents some failures; false alarms, process upsets, noise and missing readings keep
prediction honest. The same config always gives the same output.
"""

from precursor.simulator.config import FleetConfig
from precursor.simulator.engine import Degradation
from precursor.simulator.files import FleetFiles, FleetSummary, write_fleet
from precursor.simulator.fleet import FleetData, machine_attributes, simulate_fleet
from precursor.simulator.physics import FAILURE_KINDS, PARTS, SENSORS
from precursor.simulator.stream import stream_fleet

__all__ = [
    "FAILURE_KINDS",
    "PARTS",
    "SENSORS",
    "Degradation",
    "FleetConfig",
    "FleetData",
    "FleetFiles",
    "FleetSummary",
    "machine_attributes",
    "simulate_fleet",
    "stream_fleet",
    "write_fleet",
]
