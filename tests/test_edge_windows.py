"""Event-time windows per machine, including the documented rule for out-of-order and late readings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from edge_agent.config import WindowSpec
from edge_agent.windows import WindowBuilder
from precursor.contracts.messages import Event, TelemetryReading

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def reading(minute: float, machine: str = "m1", **values: float | None) -> TelemetryReading:
    at = T0 + timedelta(minutes=minute)
    return TelemetryReading(timestamp=at, machine_id=machine, values=values or {"v": minute})


def builder(length: str = "30m", every: str = "10m", min_points: int = 1) -> WindowBuilder:
    return WindowBuilder(WindowSpec(length=length, every=every, min_points=min_points))


def test_window_is_emitted_when_the_first_reading_past_its_boundary_arrives() -> None:
    b = builder()
    emitted = [w for m in range(0, 41, 5) if (w := b.add_reading(reading(m))) is not None]
    assert [w.end for w in emitted] == [T0 + timedelta(minutes=x) for x in (10, 20, 30, 40)]
    last = emitted[-1]
    assert last.start == T0 + timedelta(minutes=10)
    assert last.values[:, 0].tolist() == [10, 15, 20, 25, 30, 35]  # [start, end) of the 30 minute window


def test_out_of_order_within_the_open_period_is_kept_and_late_readings_are_dropped_and_counted() -> None:
    b = builder()
    for m in (0, 4, 2):  # 2 arrives after 4, but its window is still open
        assert b.add_reading(reading(m)) is None
    w = b.add_reading(reading(11))
    assert w is not None and w.values[:, 0].tolist() == [0, 2, 4]
    assert b.add_reading(reading(9)) is None  # the window ending at 10 was already scored
    assert b.late_dropped == 1


def test_machines_are_windowed_independently_and_sensors_may_differ() -> None:
    b = builder(length="20m", every="10m")
    b.add_reading(reading(1, "a", temp=1.0))
    b.add_reading(reading(2, "b", vib=5.0, temp=None))
    w_a = b.add_reading(reading(12, "a", temp=2.0))
    w_b = b.add_reading(reading(13, "b", vib=6.0))
    assert w_a is not None and w_a.sensors == ("temp",)
    assert w_b is not None and w_b.sensors == ("temp", "vib")
    assert np.isnan(w_b.values[0, 0]) and w_b.values[0, 1] == 5.0


def test_a_quiet_gap_emits_one_window_not_one_per_missed_period() -> None:
    b = builder()
    b.add_reading(reading(1))
    assert b.add_reading(reading(125)) is None  # [90, 120) is empty: nothing to score
    w = b.add_reading(reading(131))
    assert w is not None and w.end == T0 + timedelta(minutes=130)
    assert w.values[:, 0].tolist() == [125]


def test_windows_carry_event_context_up_to_their_end_and_last_maintenance_beyond_the_lookback() -> None:
    b = WindowBuilder(WindowSpec(length="30m", every="10m", min_points=1, event_lookback="1h"))
    b.add_event(Event(timestamp=T0, machine_id="m1", event="maintenance:bearing"))
    b.add_event(Event(timestamp=T0 + timedelta(minutes=100), machine_id="m1", event="error:E42"))
    b.add_reading(reading(95))
    w = b.add_reading(reading(111))
    assert w is not None
    assert [e.event for e in w.events] == ["maintenance:bearing", "error:E42"]
    b.add_event(Event(timestamp=T0 + timedelta(minutes=115), machine_id="m1", event="error:E43"))
    w2 = b.add_reading(reading(121))
    assert w2 is not None and [e.event for e in w2.events][-1] == "error:E43"


def test_too_few_points_means_no_window() -> None:
    b = builder(min_points=3)
    b.add_reading(reading(1))
    assert b.add_reading(reading(11)) is None


def test_a_repeated_reading_or_event_is_dropped_and_counted() -> None:
    b = builder()
    for m in (0, 4, 4, 2, 2):  # a redelivered message repeats an instant the machine already has
        assert b.add_reading(reading(m)) is None
    w = b.add_reading(reading(11))
    assert w is not None and w.values[:, 0].tolist() == [0, 2, 4]
    assert b.repeats_dropped == 2
    error = Event(timestamp=T0, machine_id="m1", event="error:E1")
    assert b.add_event(error) is True
    assert b.add_event(error) is False


class Journal:
    def __init__(self) -> None:
        self.readings: list[object] = []
        self.marks: dict[str, int] = {}
        self.events: list[Event] = []

    def accepted(self, r: object) -> None:
        self.readings.append(r)

    def emitted(self, machine_id: str, boundary: int) -> None:
        self.marks[machine_id] = boundary

    def event(self, e: Event) -> None:
        self.events.append(e)


def test_restored_state_emits_the_same_windows_as_an_uninterrupted_builder() -> None:
    journal = Journal()
    first = WindowBuilder(WindowSpec(length="30m", every="10m", min_points=1), journal=journal)
    first.add_event(Event(timestamp=T0, machine_id="m1", event="maintenance:seal"))
    for m in range(0, 25, 3):
        first.add_reading(reading(m))
    # What a journal kept lets a new builder carry on where the first stopped.
    second = WindowBuilder(WindowSpec(length="30m", every="10m", min_points=1))
    second.restore(journal.marks, journal.readings, journal.events)  # type: ignore[arg-type]
    uninterrupted = first.add_reading(reading(31))
    resumed = second.add_reading(reading(31))
    assert uninterrupted is not None and resumed is not None
    assert resumed.values.tolist() == uninterrupted.values.tolist()
    assert [e.event for e in resumed.events] == ["maintenance:seal"]
    assert second.add_reading(reading(5)) is None and second.late_dropped == 1  # the restored marks hold too
