"""Raw records to readings: every way a record can be wrong gets a reason that names the field and the value."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.parsing import Reading, RecordParser, csv_fields
from precursor.contracts.formats import RowError
from precursor.contracts.messages import Event, TelemetryReading

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


# --- records that used to stop a source (an exception out of the parser) --------------------------------------------

T = 1767225600


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # float() of a 400-digit int raises OverflowError, not ValueError: it went straight through the parser.
        (f'{{"timestamp": {"9" * 400}, "machine_id": "m1", "temp": 1}}', "is not a time between 1970 and 9999"),
        (f'{{"timestamp": -{"9" * 400}, "machine_id": "m1", "temp": 1}}', "is not a time between 1970 and 9999"),
        # json.loads raises a plain ValueError past Python's 4,300-digit int conversion limit.
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": {"7" * 5000}}}', "not valid JSON: Exceeds the limit"),
        (f'{{"timestamp": {"7" * 5000}, "machine_id": "m1", "temp": 1}}', "not valid JSON: Exceeds the limit"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": ' + "[" * 900 + "]" * 900 + "}", "not a number"),
        (f'{{"timestamp": {T}, "machine_id": "m\\u0000", "temp": 1}}', "is not an identifier"),
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": 1}}\x00', "not valid JSON"),
        ("null", "expected a JSON object, got NoneType"),
        ('"text"', "expected a JSON object, got str"),
        ("[1, 2]", "expected a JSON object, got int"),
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": false}}', "is a boolean, not a number"),
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": "1e3"}}', "is text, not a number"),
        (f'{{"timestamp": {T}, "machine_id": "m1", "temp": {{"a": 1}}}}', "is a dict, not a number"),
    ],
)
def test_json_records_that_used_to_raise_are_refused_with_a_reason(text: str, reason: str) -> None:
    parser = RecordParser("mqtt", max_record_bytes=1 << 20)
    for payload in (text, text.encode()):  # a file's line, an MQTT payload
        records = parser.json_line(payload, 3)
        assert records and all(isinstance(r, RowError) for r in records)
        assert reason in records[0].reason, records[0].reason


def test_json_payload_bytes_that_are_not_utf8_are_refused_and_a_bom_is_read() -> None:
    parser = RecordParser("mqtt")
    good = f'{{"timestamp": {T}, "machine_id": "m1", "temp": 1}}'
    (latin1,) = parser.json_line(good.replace("m1", "m\xe9").encode("latin-1"), 1)
    assert isinstance(latin1, RowError) and "not valid UTF-8" in latin1.reason
    (utf16,) = parser.json_line(good.encode("utf-16"), 2)  # json.loads alone would take it
    assert isinstance(utf16, RowError) and "not valid UTF-8" in utf16.reason
    for payload in ("\ufeff" + good, ("\ufeff" + good).encode()):
        (bom,) = parser.json_line(payload, 3)
        assert isinstance(bom, Reading) and bom.values == (1.0,)


BIG = ["1e308", "-1e308", "3.5e38", "-3.41e38", "1" * 400]


@pytest.mark.parametrize("value", BIG)
def test_a_value_beyond_float32_is_refused_on_every_csv_path_naming_sensor_and_value(value: str) -> None:
    """A window holds float32: 1e308 is finite in float64 and was an infinity there (one machine's risk dropped
    from 0.998 to 0.019)."""
    good = f"{T},pump-1,1.5,2\n"
    bad = f"{T + 1},pump-1,{value},2\n"
    parser = RecordParser("t.csv")
    layout = parser.csv_layout(HEADER)
    row_by_row = parser.csv_row(layout, bad.strip().split(","), 9, bad.strip())
    # csv_lines: the block path (every row usual) and the line-by-line shortcut (a known stamp and machine)
    block = parser.csv_lines(layout, [good, bad, good.replace(f"{T}", f"{T + 2}")], 2)
    shortcut = parser.csv_lines(layout, [good, good.replace("1.5", value), "x\n"], 2)
    assert isinstance(block[0], Reading) and isinstance(block[2], Reading)
    for refused in (row_by_row, block[1], shortcut[1]):
        assert isinstance(refused, RowError), refused
        assert f"sensor temp={value!r}"[:20] in refused.reason
        assert ("float32" if "e" in value else "not a finite number") in refused.reason  # '1' * 400 reads as inf


@pytest.mark.parametrize("value", [1e308, -3.5e38, 10**39, 10**400])
def test_a_value_beyond_float32_is_refused_in_json_and_parquet_rows(value: float) -> None:
    parser = RecordParser("x")
    text = f'{{"timestamp": {T}, "machine_id": "m1", "temp": {value}}}'
    (from_json,) = parser.json_line(text, 1)
    from_parquet = parser.json_record({"timestamp": T, "machine_id": "m1", "temp": value}, 2, "", nan_is_missing=True)
    for refused in (from_json, from_parquet):
        assert isinstance(refused, RowError) and "sensor temp=" in refused.reason
        assert "float32" in refused.reason or "is too large" in refused.reason
    fits = parser.json_line(f'{{"timestamp": {T}, "machine_id": "m1", "temp": 3.4e38, "vib": -0.0}}', 3)[0]
    assert isinstance(fits, Reading) and fits.values == (3.4e38, -0.0)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (f'{T},pump-1,"1",2\r3', "not a CSV line"),  # the csv module raises on a bare carriage return
        (f'{T},pump-1,"{"1" * 200_000}",2', "not a CSV line"),  # and past its field size limit
    ],
)
def test_csv_lines_the_csv_module_refuses_are_quarantined_not_raised(line: str, reason: str) -> None:
    parser = RecordParser("t.csv")
    layout = parser.csv_layout(HEADER)
    good = f"{T},pump-1,1,2\n"
    records = parser.csv_lines(layout, [good, line + "\n", good.replace(f"{T}", f"{T + 1}")], 2)
    assert [type(r).__name__ for r in records] == ["Reading", "RowError", "Reading"]
    assert isinstance(records[1], RowError) and reason in records[1].reason and records[1].line == 3
    assert parser.csv_header("\ufeff" + ",".join(HEADER)).error is None  # a byte order mark before the header
    assert "not a CSV line" in (parser.csv_header('timestamp,"machine_id",x\ry').error or "")
