"""The fleet simulator: deterministic, plausible before failures, readable by the generic formats, streamable."""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import typer

from precursor.contracts.formats import RowError, iter_telemetry, read_events, read_machines, read_telemetry_table
from precursor.contracts.messages import Event, TelemetryReading
from precursor.simulate_cli import simulate_command
from precursor.simulator import FAILURE_KINDS, FleetConfig, FleetData, simulate_fleet, stream_fleet, write_fleet
from precursor.simulator.engine import chunk_samples
from precursor.simulator.physics import GENERIC_ERROR_CODES
from precursor.simulator.profiles import PROFILES

HOUR = 3600


@pytest.fixture(scope="module")
def fleet() -> FleetData:
    """A month of 24 machines at 10-minute readings: enough failures of every kind to measure signatures."""
    return simulate_fleet(FleetConfig(machines=24, duration="30d", interval="10m", seed=11, missing_rate=0.03))


def _machine(data: FleetData, machine_id: str) -> tuple[np.ndarray, np.ndarray]:
    table = data.telemetry
    for mid, rows in table.machines():
        if mid == machine_id:
            return table.timestamps[rows], table.values[rows].astype(np.float64)
    raise KeyError(machine_id)


def _healthy_mask(data: FleetData, machine_id: str, stamps: np.ndarray) -> np.ndarray:
    """Readings away from any degradation (and from the repair after it)."""
    healthy = np.ones(len(stamps), dtype=bool)
    assert data.config.duration is not None
    run_end = (data.config.start + data.config.duration).timestamp()
    for d in data.degradations:
        if d.machine_id == machine_id:
            end = d.end.timestamp() if d.end is not None else run_end
            healthy &= (stamps < d.onset.timestamp()) | (stamps >= end + 12 * HOUR)
    return healthy


def _spike_rate(current: np.ndarray) -> float:
    """Share of readings where motor current jumps more than 12 % above the reading before it."""
    ratio = current[1:] / current[:-1]
    ratio = ratio[np.isfinite(ratio)]
    return float(np.mean(ratio > 1.12)) if len(ratio) else 0.0


# -- determinism -------------------------------------------------------------------------------------------------


def test_same_config_writes_byte_identical_files(tmp_path: Path) -> None:
    config = FleetConfig(machines=4, duration="4d", interval="15m", seed=5)
    first = write_fleet(config, tmp_path / "a")
    second = write_fleet(config, tmp_path / "b")
    for name in ("telemetry", "events", "machines", "ground_truth"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.read_bytes() == b.read_bytes(), name
    assert first.summary.rows == len(read_telemetry_table(first.telemetry).timestamps) > 0


def test_different_seeds_give_different_fleets() -> None:
    a = simulate_fleet(FleetConfig(machines=3, duration="3d", interval="15m", seed=1))
    b = simulate_fleet(FleetConfig(machines=3, duration="3d", interval="15m", seed=2))
    assert a != b
    assert not np.array_equal(a.telemetry.values[:100], b.telemetry.values[:100], equal_nan=True)
    assert simulate_fleet(FleetConfig(machines=3, duration="3d", interval="15m", seed=1)) == a


def test_a_larger_fleet_keeps_its_first_machines() -> None:
    small = simulate_fleet(FleetConfig(machines=2, duration="3d", interval="30m", seed=4))
    large = simulate_fleet(FleetConfig(machines=5, duration="3d", interval="30m", seed=4))
    for machine_id in small.machines:
        assert small.machines[machine_id] == large.machines[machine_id]
        assert np.array_equal(_machine(small, machine_id)[1], _machine(large, machine_id)[1], equal_nan=True)
        assert [e for e in small.events if e.machine_id == machine_id] == [
            e for e in large.events if e.machine_id == machine_id
        ]


# -- physics -----------------------------------------------------------------------------------------------------


def test_failures_are_preceded_by_their_signature(fleet: FleetData) -> None:
    """In the 12 h before a failure, the kind's signature sensors sit well away from the machine's healthy level."""
    signatures = {
        "bearing": ("vibration_rms", +1),
        "overheat": ("winding_temp", +1),
        "seal_leak": ("pressure", -1),
        "clog": ("flow", -1),
    }
    sensors = fleet.telemetry.sensors
    shifts: dict[str, list[float]] = {kind: [] for kind in [*signatures, "electrical"]}
    for failure in fleet.failures():
        kind = str(failure.detail)
        stamps, values = _machine(fleet, failure.machine_id)
        healthy = _healthy_mask(fleet, failure.machine_id, stamps)
        at = failure.timestamp.timestamp()
        before = (stamps >= at - 12 * HOUR) & (stamps < at)
        if before.sum() < 6:
            continue
        if kind == "electrical":
            current = values[:, sensors.index("motor_current")]
            shifts[kind].append(_spike_rate(current[before]) - _spike_rate(current[healthy]))
            continue
        sensor, sign = signatures[kind]
        column = values[:, sensors.index(sensor)]
        level, spread = np.nanmean(column[healthy]), np.nanstd(column[healthy])
        shifts[kind].append(sign * (np.nanmean(column[before]) - level) / spread)
    for kind, found in shifts.items():
        assert len(found) >= 5, f"too few {kind} failures to judge: {len(found)}"
    for kind in signatures:
        assert np.median(shifts[kind]) > 1.0, (kind, np.round(shifts[kind], 2))
    assert np.median(shifts["electrical"]) > 0.02, np.round(shifts["electrical"], 3)


def test_bearing_vibration_rises_before_bearing_temperature(fleet: FleetData) -> None:
    """Halfway through a bearing degradation vibration has moved more (in healthy spreads) than temperature has."""
    sensors = fleet.telemetry.sensors
    vibration_first = 0
    judged = 0
    for d in fleet.degradations:
        if d.kind != "bearing" or d.outcome != "failure" or d.warning_h < 12:
            continue
        stamps, values = _machine(fleet, d.machine_id)
        healthy = _healthy_mask(fleet, d.machine_id, stamps)
        middle = d.onset.timestamp() + 0.6 * d.warning_h * HOUR
        near = (stamps >= middle - 2 * HOUR) & (stamps < middle + 2 * HOUR)
        z = {}
        for name in ("vibration_rms", "bearing_temp"):
            column = values[:, sensors.index(name)]
            z[name] = (np.nanmean(column[near]) - np.nanmean(column[healthy])) / np.nanstd(column[healthy])
        judged += 1
        vibration_first += z["vibration_rms"] > z["bearing_temp"]
    assert judged >= 5
    assert vibration_first / judged > 0.8


def test_warning_times_vary_and_some_failures_are_sudden(fleet: FleetData) -> None:
    warnings = np.array([d.warning_h for d in fleet.degradations if d.outcome == "failure"])
    assert len(warnings) >= 40
    assert warnings.std() / warnings.mean() > 0.4
    assert np.any(warnings < 3.0)
    assert np.any(warnings > 48.0)
    machine_months = fleet.config.machines  # the fixture runs 30 days
    assert 1.5 < len(warnings) / machine_months < 6, "failures per machine-month"


def test_false_alarms_degrade_and_recover_without_failure(fleet: FleetData) -> None:
    recovered = [d for d in fleet.degradations if d.outcome == "recovered"]
    assert recovered and all(not d.bound_for_failure for d in recovered)
    failures = {(f.machine_id, f.timestamp) for f in fleet.failures()}
    assert not any((d.machine_id, d.end) in failures for d in recovered)


def test_machine_is_down_after_a_failure_then_healthy_again(fleet: FleetData) -> None:
    for failure in fleet.failures()[:20]:
        stamps, _ = _machine(fleet, failure.machine_id)
        repaired = [
            e
            for e in fleet.events
            if e.machine_id == failure.machine_id and e.kind == "maintenance" and e.timestamp > failure.timestamp
        ]
        assert repaired, f"no repair after {failure}"
        back = repaired[0].timestamp.timestamp()
        down = (stamps >= failure.timestamp.timestamp()) & (stamps < back)
        assert not down.any(), "readings while down for repair"


def test_maintenance_stops_degradation_and_prevents_failures() -> None:
    seldom = simulate_fleet(FleetConfig(machines=20, duration="30d", interval="30m", seed=8, maintenance_interval=None))
    often = simulate_fleet(FleetConfig(machines=20, duration="30d", interval="30m", seed=8, maintenance_interval="2d"))
    assert len(often.failures()) < 0.8 * len(seldom.failures())
    prevented = [d for d in often.degradations if d.outcome == "prevented"]
    assert len(prevented) >= 10
    maintained = {(e.machine_id, e.timestamp, e.detail) for e in often.events if e.kind == "maintenance"}
    for d in prevented:
        assert (d.machine_id, d.end, FAILURE_KINDS[d.kind].part) in maintained
    # After a bearing is serviced mid-degradation, vibration falls back.
    sensors = often.telemetry.sensors
    drops = []
    for d in prevented:
        if d.kind != "bearing" or d.end is None:
            continue
        stamps, values = _machine(often, d.machine_id)
        vibration = values[:, sensors.index("vibration_rms")]
        at = d.end.timestamp()
        before = vibration[(stamps >= at - 3 * HOUR) & (stamps < at)]
        after = vibration[(stamps >= at) & (stamps < at + 3 * HOUR)]
        if len(before) and len(after):
            drops.append(np.nanmean(before) - np.nanmean(after))
    assert drops and np.mean(drops) > 0


def test_error_codes_get_more_frequent_as_failure_nears(fleet: FleetData) -> None:
    """The failing kind's codes: rare while healthy, more common a day out, far more common in the last hours."""

    def rate_before(lo_h: float, hi_h: float) -> float:
        count = 0
        for failure in fleet.failures():
            codes = set(FAILURE_KINDS[str(failure.detail)].error_codes)
            window = (failure.timestamp - timedelta(hours=hi_h), failure.timestamp - timedelta(hours=lo_h))
            count += sum(
                1
                for e in errors_by_machine.get(failure.machine_id, [])
                if e.detail in codes and window[0] <= e.timestamp < window[1]
            )
        return count / ((hi_h - lo_h) * len(fleet.failures()))

    errors_by_machine: dict[str, list[Event]] = {}
    for e in fleet.events:
        if e.kind == "error":
            errors_by_machine.setdefault(e.machine_id, []).append(e)
    kind_codes = {c for kind in FAILURE_KINDS.values() for c in kind.error_codes}
    healthy_errors = 0
    healthy_hours = 0.0
    for machine_id, rows in fleet.telemetry.machines():
        stamps = fleet.telemetry.timestamps[rows]
        healthy = _healthy_mask(fleet, machine_id, stamps)
        healthy_hours += healthy.sum() * fleet.config.interval_s / HOUR
        healthy_at = set(stamps[healthy].tolist())
        healthy_errors += sum(
            1
            for e in errors_by_machine.get(machine_id, [])
            if e.detail in kind_codes and int(e.timestamp.timestamp()) in healthy_at
        )
    healthy_rate = healthy_errors / healthy_hours  # any kind's codes, per machine-hour, away from degradation
    far, near = rate_before(12, 24), rate_before(0, 6)
    assert near > 2 * far > 0, (near, far)
    assert near > 20 * healthy_rate > 0, (near, healthy_rate)
    generic = sum(1 for e in fleet.events if e.kind == "error" and e.detail in GENERIC_ERROR_CODES)
    assert generic > 0, "background errors that say nothing about failures"


def test_anomalies_are_logged_both_near_failures_and_away_from_them(fleet: FleetData) -> None:
    anomalies = [e for e in fleet.events if e.kind == "anomaly"]
    assert len(anomalies) >= 10
    failures_at: dict[str, list[float]] = {}
    for f in fleet.failures():
        failures_at.setdefault(f.machine_id, []).append(f.timestamp.timestamp())
    near = [
        any(0 <= t - a.timestamp.timestamp() < 72 * HOUR for t in failures_at.get(a.machine_id, [])) for a in anomalies
    ]
    assert 0 < sum(near) < len(anomalies)


def test_missing_rate_is_about_as_configured(fleet: FleetData) -> None:
    assert math.isclose(float(np.isnan(fleet.telemetry.values).mean()), 0.03, abs_tol=0.003)
    none_missing = simulate_fleet(FleetConfig(machines=2, duration="2d", interval="30m", missing_rate=0))
    assert not np.isnan(none_missing.telemetry.values).any()


def test_only_enabled_failure_kinds_happen() -> None:
    config = FleetConfig(machines=20, duration="20d", interval="30m", seed=3, failure_kinds=["clog", "bearing"])
    data = simulate_fleet(config)
    assert set(data.failures_by_kind()) == {"bearing", "clog"}
    assert {d.kind for d in data.degradations} <= {"bearing", "clog"}
    allowed = (
        set(GENERIC_ERROR_CODES) | set(FAILURE_KINDS["bearing"].error_codes) | set(FAILURE_KINDS["clog"].error_codes)
    )
    assert {e.detail for e in data.events if e.kind == "error"} <= allowed
    healthy = simulate_fleet(FleetConfig(machines=5, duration="10d", interval="1h", failure_kinds=[]))
    assert healthy.failures() == [] and healthy.degradations == []


def test_telemetry_has_load_cycles_and_per_machine_offsets(fleet: FleetData) -> None:
    sensors = fleet.telemetry.sensors
    stamps, values = _machine(fleet, "m-001")
    current = values[:, sensors.index("motor_current")]
    hour = (stamps % 86_400) // 3600
    by_hour = np.array([np.nanmean(current[hour == h]) for h in range(24)])
    assert by_hour.max() > 1.15 * by_hour.min(), "a daily load cycle"
    means = [np.nanmean(_machine(fleet, m)[1][:, sensors.index("bearing_temp")]) for m in ("m-001", "m-002", "m-003")]
    assert len({round(m, 1) for m in means}) == 3


# -- files -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_written_files_read_back_through_the_generic_formats(tmp_path: Path, fmt: str) -> None:
    config = FleetConfig(machines=3, duration="3d", interval="20m", seed=9, missing_rate=0.05)
    data = simulate_fleet(config)
    files = write_fleet(config, tmp_path, format=fmt)  # type: ignore[arg-type]
    assert files.telemetry.suffix == f".{fmt}"
    assert not [item for item in iter_telemetry(files.telemetry) if isinstance(item, RowError)]
    table = read_telemetry_table(files.telemetry)
    assert table.sensors == data.telemetry.sensors
    assert np.array_equal(table.machine_ids, data.telemetry.machine_ids)
    assert np.array_equal(table.timestamps, data.telemetry.timestamps)
    assert np.array_equal(table.values, data.telemetry.values, equal_nan=True)
    assert read_events(files.events) == data.events
    assert read_machines(files.machines) == data.machines
    assert files.summary.failures_by_kind == data.failures_by_kind()
    assert files.summary.rows == len(data.telemetry.timestamps)


def test_telemetry_file_is_in_time_order(tmp_path: Path) -> None:
    files = write_fleet(FleetConfig(machines=3, duration="2d", interval="30m"), tmp_path)
    stamps = [r.timestamp for r in iter_telemetry(files.telemetry) if isinstance(r, TelemetryReading)]
    assert stamps == sorted(stamps)


def test_bad_requests_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gremlins"):
        FleetConfig(failure_kinds=["gremlins"])
    with pytest.raises(ValueError, match="interval"):
        FleetConfig(interval="0.5s")
    endless = FleetConfig(duration=None)
    with pytest.raises(ValueError, match="duration=None"):
        simulate_fleet(endless)
    with pytest.raises(ValueError, match="format='xml'"):
        write_fleet(FleetConfig(machines=1, duration="1h"), tmp_path, format="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="speedup=-1"):
        next(stream_fleet(endless, speedup=-1))


# -- streaming ---------------------------------------------------------------------------------------------------


def test_stream_yields_exactly_the_simulated_fleet_in_time_order() -> None:
    config = FleetConfig(machines=4, duration="3d", interval="15m", seed=6)
    items = list(stream_fleet(config, speedup=0))
    stamps = [item.timestamp for item in items]
    assert stamps == sorted(stamps)
    data = simulate_fleet(config)
    assert [i for i in items if isinstance(i, Event)] == data.events
    readings = sorted((i for i in items if isinstance(i, TelemetryReading)), key=lambda r: (r.machine_id, r.timestamp))
    assert readings == list(data.readings())


def test_stream_starting_later_is_the_tail_of_the_full_stream() -> None:
    config = FleetConfig(machines=3, duration="3d", interval="30m", seed=2)
    full = list(stream_fleet(config, speedup=math.inf))
    start_at = config.start + timedelta(days=1, hours=5)
    tail = list(stream_fleet(config, speedup=math.inf, start_at=start_at))
    assert tail == [item for item in full if item.timestamp >= start_at]
    with pytest.raises(ValueError, match="start_at"):
        next(stream_fleet(config, start_at=config.start - timedelta(hours=1)))


def test_endless_stream_is_lazy() -> None:
    config = FleetConfig(machines=3, duration=None, interval="10m", seed=1)
    chunk_span = timedelta(seconds=chunk_samples(config) * config.interval_s)
    began = time.perf_counter()
    items = list(itertools.islice(stream_fleet(config, speedup=0), 4 * chunk_samples(config)))
    assert time.perf_counter() - began < 3.0
    assert items[-1].timestamp - items[0].timestamp > chunk_span, "crossed into the next chunk"
    assert [i.timestamp for i in items] == sorted(i.timestamp for i in items)


def test_stream_is_paced_by_the_wall_clock() -> None:
    config = FleetConfig(machines=2, duration="1h", interval="1m", seed=3)
    speedup = 3600 / 0.4  # one simulated hour in 0.4 s
    began = time.monotonic()
    arrivals = [(time.monotonic() - began, item.timestamp) for item in stream_fleet(config, speedup=speedup)]
    elapsed = time.monotonic() - began
    assert 0.35 < elapsed < 1.5
    origin = arrivals[0][1]
    for wall, simulated in arrivals:
        assert wall >= (simulated - origin).total_seconds() / speedup - 0.01


# -- command line ------------------------------------------------------------------------------------------------


def test_simulate_command_writes_files_and_summarises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    simulate_command(out=tmp_path, machines=3, days=5, interval="30m", seed=1, kinds="bearing,overheat", format="csv")
    shown = capsys.readouterr().out
    assert "3 machines" in shown and "readings" in shown and str(tmp_path / "telemetry.csv") in shown
    failures = Counter(e.detail for e in read_events(tmp_path / "events.csv") if e.kind == "failure")
    assert set(failures) <= {"bearing", "overheat"}
    assert all(f"{kind} {count}" in shown for kind, count in failures.items())
    assert len(read_machines(tmp_path / "machines.csv")) == 3


# -- profiles ----------------------------------------------------------------------------------------------------

SIGNATURES = {
    "bearing": ("vibration_rms", +1),
    "overheat": ("winding_temp", +1),
    "seal_leak": ("pressure", -1),
    "clog": ("flow", -1),
}


def _signature_shifts(data: FleetData, hours: float) -> list[float]:
    """Per failure with a sensor signature: how far its sensor sits from the healthy level in the hours before, in
    healthy standard deviations."""
    sensors = data.telemetry.sensors
    shifts = []
    for failure in data.failures():
        if failure.detail not in SIGNATURES:
            continue
        stamps, values = _machine(data, failure.machine_id)
        healthy = _healthy_mask(data, failure.machine_id, stamps)
        at = failure.timestamp.timestamp()
        before = (stamps >= at - hours * HOUR) & (stamps < at)
        if before.sum() < 3:
            continue
        sensor, sign = SIGNATURES[str(failure.detail)]
        column = values[:, sensors.index(sensor)]
        shifts.append(sign * (np.nanmean(column[before]) - np.nanmean(column[healthy])) / np.nanstd(column[healthy]))
    return shifts


def _own_codes_before_failures(data: FleetData, hours: float) -> tuple[int, int]:
    """(the failing kind's own error codes in the hours before each failure, failures)."""
    failures = data.failures()
    count = 0
    for failure in failures:
        own = FAILURE_KINDS[str(failure.detail)].error_codes
        at = failure.timestamp
        count += sum(
            1
            for e in data.events
            if e.machine_id == failure.machine_id
            and e.kind == "error"
            and e.detail in own
            and timedelta(0) < at - e.timestamp <= timedelta(hours=hours)
        )
    return count, len(failures)


def test_no_profile_is_the_slow_degradation_profile() -> None:
    size = {"machines": 3, "duration": "4d", "interval": "30m", "seed": 2}
    plain = simulate_fleet(FleetConfig(**size))
    named = simulate_fleet(FleetConfig(profile="slow-degradation", **size))
    assert np.array_equal(plain.telemetry.values, named.telemetry.values, equal_nan=True)
    assert plain.events == named.events and plain.degradations == named.degradations


def test_a_profile_presets_fields_and_explicit_fields_win() -> None:
    daily = FleetConfig(profile="daily")
    assert daily.interval_s == 86_400 and daily.time_scale > 1
    assert FleetConfig(profile="daily", interval="12h").interval_s == 43_200
    assert FleetConfig(profile="server-metrics").interval_s == 60
    for name in PROFILES:
        FleetConfig(profile=name)  # every preset is a valid config
    with pytest.raises(ValueError, match=r"unknown profile 'factory'.*error-codes"):
        FleetConfig(profile="factory")


def test_error_codes_profile_announces_failures_by_code_bursts_not_sensors() -> None:
    size = {"machines": 12, "duration": "40d", "interval": "30m", "seed": 5}
    slow = simulate_fleet(FleetConfig(profile="slow-degradation", **size))
    coded = simulate_fleet(FleetConfig(profile="error-codes", **size))
    slow_shift, coded_shift = _signature_shifts(slow, 6), _signature_shifts(coded, 6)
    assert len(slow_shift) >= 10 and len(coded_shift) >= 10
    assert np.median(slow_shift) > 4 * np.median(coded_shift), (np.median(slow_shift), np.median(coded_shift))
    assert np.median(coded_shift) < 1.0  # within the healthy spread
    slow_codes, slow_failures = _own_codes_before_failures(slow, 24)
    coded_codes, coded_failures = _own_codes_before_failures(coded, 24)
    assert coded_codes / coded_failures > 5 * slow_codes / slow_failures
    # bursts: the same codes without them come one at a time
    plain = simulate_fleet(FleetConfig(profile="error-codes", error_burst=0, **size))
    plain_codes, plain_failures = _own_codes_before_failures(plain, 24)
    assert coded_codes / coded_failures > 2.5 * plain_codes / plain_failures


def test_server_metrics_profile_fails_within_the_hour_and_daily_profile_over_days() -> None:
    server = simulate_fleet(FleetConfig(profile="server-metrics", machines=4, duration="2d", seed=1))
    warnings = [d.warning_h for d in server.degradations if d.outcome == "failure"]
    assert len(warnings) >= 10 and np.median(warnings) < 1.0
    steps = np.diff(_machine(server, "m-001")[0])
    assert np.min(steps) == np.median(steps) == 60  # longer steps only where the machine was down
    daily = simulate_fleet(FleetConfig(profile="daily", machines=8, duration="360d", seed=1))
    warnings = [d.warning_h for d in daily.degradations if d.outcome == "failure"]
    assert len(warnings) >= 10 and np.median(warnings) > 72
    stamps, _ = _machine(daily, "m-001")
    steps = np.diff(stamps)
    assert np.min(steps) == np.median(steps) == 86_400 and np.all(steps % 86_400 == 0)


def test_simulate_command_takes_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    simulate_command(out=tmp_path / "a", profile="server-metrics", machines=2, days=0.5)
    assert "every 1m" in capsys.readouterr().out
    stamps = read_telemetry_table(tmp_path / "a" / "telemetry.csv").timestamps
    assert np.min(np.diff(np.unique(stamps))) == 60
    simulate_command(out=tmp_path / "b", profile="server-metrics", machines=2, days=0.5, interval="2m")
    assert "every 2m" in capsys.readouterr().out
    with pytest.raises(typer.BadParameter, match="unknown profile 'factory'"):
        simulate_command(out=tmp_path / "c", profile="factory")
