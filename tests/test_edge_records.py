"""Raw records to readings: every way a record can be wrong gets a reason that names the field and the value."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from contracts.formats import RowError
from contracts.messages import Event, TelemetryReading
from edge_agent.records import Reading, RecordParser, csv_fields

HEADER = ["timestamp", "machine_id", "temp", "vib"]


def row(*fields: str) -> Reading | Event | RowError:
    parser = RecordParser("t.csv")
    return parser.csv_row(parser.csv_layout(HEADER), list(fields), 7, ",".join(fields))


def test_a_good_csv_row_is_a_reading_with_sorted_sensors_and_blanks_missing() -> None:
    r = row("2026-01-01T00:00:00Z", "pump-1", "", "0.25")
    assert isinstance(r, Reading)
    assert (r.machine_id, r.t, r.sensors) == ("pump-1", 1767225600.0, ("temp", "vib"))
    assert math.isnan(r.values[0]) and r.values[1] == 0.25


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (("2026-01-01T00:00:00Z", "pump-1", "hot", "1"), "sensor temp='hot' is not a number"),
        (("2026-01-01T00:00:00Z", "pump-1", "nan", "1"), "sensor temp='nan' is not a finite number"),
        (("2026-01-01T00:00:00Z", "pump-1", "1", "-inf"), "sensor vib='-inf' is not a finite number"),
        (("yesterday", "pump-1", "1", "1"), "timestamp='yesterday' is neither ISO 8601 nor epoch seconds"),
        (("-5", "pump-1", "1", "1"), "timestamp='-5' is not a time between 1970 and 9999"),
        (("2026-01-01T00:00:00Z", "pump 1", "1", "1"), "machine_id='pump 1' is not an identifier"),
        (("2026-01-01T00:00:00Z", "", "1", "1"), "machine_id='' is not an identifier"),
        (("2026-01-01T00:00:00Z", "pump-1", "1"), "has 3 fields, the header has 4"),
    ],
)
def test_bad_csv_rows_are_refused_with_the_field_and_value(fields: tuple[str, ...], reason: str) -> None:
    r = row(*fields)
    assert isinstance(r, RowError)
    assert reason in r.reason
    assert (r.source, r.line) == ("t.csv", 7)


def test_a_bad_header_refuses_every_row_of_the_file() -> None:
    parser = RecordParser("t.csv")
    layout = parser.csv_layout(["time", "machine_id", "9lives"])
    r = parser.csv_row(layout, ["1", "m", "2"], 2, "1,m,2")
    assert isinstance(r, RowError) and "header lacks column(s) timestamp" in r.reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "an empty JSON array"),
        ("42", "expected a JSON object, got int"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "temp": "21.5"}', "sensor temp='21.5' is text, not a number"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "temp": [1]}', "sensor temp=[1] is a list, not a number"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "temp": NaN}', "sensor temp=nan is not a finite number"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "temp": Infinity}', "sensor temp=inf is not a finite number"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "temp": 1e999}', "sensor temp=inf is not a finite number"),
        ('{"timestamp": true, "machine_id": "m1", "temp": 1}', "timestamp=True is neither"),
        ('{"machine_id": "m1", "temp": 1}', "missing field(s): timestamp"),
        ('{"timestamp": 1767225600, "machine_id": 7, "temp": 1}', "machine_id=7 is not text"),
        ('{"timestamp": 1767225600, "machine_id": "m1"}', "no sensor values"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "9x": 1}', "sensor name '9x' is not valid"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "values": 3}', "values=3 is not an object"),
        ('{"timestamp": 1767225600, "machine_id": "m1", "event": "explode"}', "event='explode' is not failure"),
    ],
)
def test_bad_json_records_are_refused_with_a_reason(text: str, reason: str) -> None:
    (r,) = RecordParser("mqtt").json_line(text, 3)
    assert isinstance(r, RowError)
    assert reason in r.reason, r.reason


def test_json_readings_flat_or_nested_and_events_and_arrays() -> None:
    records = RecordParser("mqtt").json_line(
        '[{"timestamp": "2026-01-01T00:00:00", "machine_id": "m1", "vib": 1, "temp": null},'
        ' {"timestamp": 1767225660, "machine_id": "m1", "values": {"temp": 2.5}},'
        ' {"timestamp": 1767225720, "machine_id": "m1", "event": "maintenance:bearing"}]',
        1,
    )
    first, second, third = records
    assert isinstance(first, Reading) and first.sensors == ("temp", "vib") and first.values[1] == 1.0
    assert first.t == 1767225600.0  # a naive time is UTC
    assert isinstance(second, Reading) and second.values == (2.5,)
    assert isinstance(third, Event) and third.detail == "bearing"


def test_parquet_nan_is_missing_but_infinity_is_not() -> None:
    parser = RecordParser("p.parquet")
    ok = parser.json_record(
        {"timestamp": 1767225600, "machine_id": "m1", "a": float("nan")}, 1, "", nan_is_missing=True
    )
    bad = parser.json_record(
        {"timestamp": 1767225600, "machine_id": "m1", "a": float("inf")}, 2, "", nan_is_missing=True
    )
    assert isinstance(ok, Reading) and math.isnan(ok.values[0])
    assert isinstance(bad, RowError) and "not a finite number" in bad.reason


def test_reading_from_the_contract_model_matches_the_fast_path() -> None:
    contract = TelemetryReading(timestamp="2026-01-01T00:00:00Z", machine_id="m1", values={"vib": 1.0, "temp": None})
    fast = Reading.from_contract(contract)
    assert fast.sensors == ("temp", "vib") and math.isnan(fast.values[0]) and fast.values[1] == 1.0


good_fields = st.tuples(
    st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "1767225602", " 1767225603.5"]),
    st.sampled_from(["pump-1", "pump-2", "fan.3"]),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.integers(-(10**6), 10**6).map(str),
)
odd_field = st.sampled_from(["", " ", "nan", "inf", "-Infinity", "1e400", "1_000", "0x10", "hot", '"1"', "1;2", "١٢"])


@st.composite
def csv_line(draw: st.DrawFn) -> str:
    fields = list(draw(good_fields))
    if draw(st.integers(0, 3)) == 0:  # a fault somewhere: an odd field, a field too many or too few, a bad id
        kind = draw(st.integers(0, 4))
        if kind == 0:
            fields[draw(st.integers(0, 3))] = draw(odd_field)
        elif kind == 1:
            fields.append("7")
        elif kind == 2:
            fields.pop()
        elif kind == 3:
            fields[1] = "pump 9"
        else:
            fields = [draw(st.text(",\r\t 1x", max_size=6))]
    ending = draw(st.sampled_from(["\n", "\n", "\n", "\r\n"]))
    return ",".join(fields) + ending


@settings(max_examples=300, deadline=None)
@given(st.lists(csv_line(), min_size=1, max_size=40), st.booleans())
# Found by this test: an empty timestamp once matched the parser's initial "last timestamp" and read as 1970.
@example(["2026-01-01T00:00:00Z,pump-1,0.0,0\n", ",pump-1,0.0,0\n"], False)
@example([",pump-1,0.0,0\n"], False)
def test_csv_lines_in_a_block_give_what_csv_row_gives_line_by_line(lines: list[str], last_unended: bool) -> None:
    if last_unended:
        lines[-1] = lines[-1].rstrip("\r\n")
    reference = RecordParser("t.csv")
    layout = reference.csv_layout(HEADER)
    expected = []
    for n, text in enumerate(lines, start=2):
        text = text.rstrip("\r\n")
        if text:
            expected.append(reference.csv_row(layout, csv_fields(text), n, text))
    parser = RecordParser("t.csv")
    got = parser.csv_lines(parser.csv_layout(HEADER), lines, 2)
    assert repr(got) == repr(expected)  # repr: NaN != NaN, and the float types and reasons must match too
