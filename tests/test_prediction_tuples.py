"""Predictions read straight from their bytes (``pipelines.records.prediction_tuple``) agree with the contract: what
the fast reader accepts, ``Prediction`` accepts too, into the same record tuple (same values, same types); what it
cannot tell it leaves to pydantic, so every dead letter keeps pydantic's reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipelines.ingest import IngestPredictions, ParseMessages
from pipelines.kafka_io import KafkaRecord
from pipelines.records import prediction_record, prediction_tuple
from precursor.contracts.messages import DeadLetter, Prediction, encode


def _plain(seq: int = 7, **changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "schema_version": 1,
        "edge_id": "edge-0001",
        "seq": seq,
        "machine_id": "pump-00042",
        "window_start": "2026-01-01T00:00:00Z",
        "window_end": "2026-01-01T01:00:00Z",
        "horizon_h": 24.0,
        "risk": {"failure": 0.25, "bearing": 0.5},
        "model_name": "telemetry-lm",
        "model_version": "2026.01.3",
        "emitted_at": "2026-01-01T01:00:01.250000Z",
        "threshold": None,
        "reasons": None,
    }
    fields.update(changes)
    return fields


def _agrees(value: bytes) -> bytes | None:
    """Checks the fast reader against the contract on ``value``; returns it when the fast reader took it."""
    fast = prediction_tuple(value, 3, 9)
    try:
        message = Prediction.model_validate_json(value)
    except (ValidationError, OverflowError):  # a time past datetime's range fails in the UTC validator itself
        assert fast is None, value
        return None
    if fast is None:
        return None
    # repr tells 24 from 24.0 and -0.0 from 0.0: the same values of the same types.
    assert repr(fast) == repr(tuple(prediction_record(message, partition=3, offset=9))), value
    return value


def test_what_edges_send_is_read_fast_into_the_contracts_record() -> None:
    for seq in range(50):
        message = Prediction.model_validate(_plain(seq, risk={"failure": seq / 50, "seal": 1 - seq / 50}))
        assert _agrees(encode(message)) is not None
    spaced = json.dumps(_plain(horizon_h=24, threshold=0.4), indent=2).encode()  # ints for floats, whitespace
    assert _agrees(spaced) is not None
    assert _agrees(json.dumps(_plain(emitted_at="2026-01-01T02:00:01+01:00")).encode()) is not None


def test_a_plain_looking_record_the_contract_refuses_is_left_to_it() -> None:
    refused = [
        _plain(seq=-1),
        _plain(seq=2**63),
        _plain(seq=True),
        _plain(horizon_h=0),
        _plain(horizon_h=24 * 365 + 1),
        _plain(risk={}),
        _plain(risk={"failure": 1.5}),
        _plain(risk={"-bad": 0.5}),
        _plain(risk={"failure": "0.5"}),
        _plain(threshold=-0.1),
        _plain(edge_id="edge 1"),
        _plain(edge_id="e" * 129),
        _plain(machine_id="pump\n"),
        _plain(model_version=""),
        _plain(model_version="v" * 65),
        _plain(window_end="2025-12-31T23:00:00Z"),  # before its start
        _plain(window_start="2026-01-01T00:00:00"),  # naive
        _plain(window_start="2026-02-30T00:00:00Z"),
        _plain(window_start="2026-01-01T24:00:00Z"),
        _plain(emitted_at="9999-12-31T23:00:00-05:00"),  # past datetime's range in UTC
        _plain(schema_version=2),
        _plain(extra="field"),
    ]
    for fields in refused:
        value = json.dumps(fields).encode()
        assert prediction_tuple(value, 0, 0) is None, fields
        _agrees(value)
    for value in [b"", b"null", b"[]", b"\xff", json.dumps(_plain()).encode("utf-16"), b'{"seq": NaN}']:
        assert prediction_tuple(value, 0, 0) is None


def test_duplicate_keys_are_read_as_the_contract_reads_them() -> None:
    value = json.dumps(_plain()).encode()
    twice = value.replace(b'"seq": 7', b'"seq": 7, "seq": 8').replace(
        b'"failure": 0.25', b'"failure": 0.25, "failure": 0.75'
    )
    assert _agrees(twice) is not None
    assert prediction_tuple(twice, 0, 0)[1] == 8  # type: ignore[index]


EAST, WEST = timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-23, minutes=-59))
_instants = st.builds(
    "{:04d}-{:02d}-{:02d}{}{:02d}:{:02d}:{:02d}{}{}".format,
    st.sampled_from([0, 1, 999, 1000, 1969, 1970, 2026, 9998, 9999]),
    st.integers(0, 13),
    st.integers(0, 32),
    st.sampled_from(["T", "t", " ", "_"]),
    st.integers(0, 25),
    st.integers(0, 61),
    st.integers(0, 61),
    st.sampled_from(["", ".", ".5", ".123456", ".1234567", ".000000001"]),
    st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-23:59", "+24:00", "+0530", "+05:30:00", "", "UTC"]),
)
_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 0.0, 1.0, -0.0, 24, 8760, 8760.000001, True, False, None, "0.5", "24", [], {}]),
)
_identifiers = st.one_of(
    st.sampled_from(["pump-1", "a", "A.b:c_d-e", "-a", "", "a b", "é", "a\n", "x" * 128, "x" * 129, 5, None]),
    st.text(max_size=6),
)


_valid_instants = st.datetimes(
    min_value=datetime(1000, 1, 2), max_value=datetime(9998, 12, 30), timezones=st.sampled_from([UTC, EAST, WEST])
).map(lambda t: t.isoformat().replace("+00:00", "Z"))
_valid = st.fixed_dictionaries(
    {
        "edge_id": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,20}", fullmatch=True),
        "machine_id": st.sampled_from(["pump-1", "A.b:c_d-e", "x" * 128]),
        "seq": st.integers(0, 2**63 - 1),
        "window_start": st.just("1000-01-02T00:00:00+00:00"),
        "window_end": _valid_instants,
        "horizon_h": st.floats(0, 8760, exclude_min=True) | st.integers(1, 8760),
        "risk": st.dictionaries(
            st.sampled_from(["failure", "seal", "b.c:d"]), st.floats(0, 1) | st.integers(0, 1), min_size=1
        ),
        "model_name": st.just("lm"),
        "model_version": st.text(st.characters(max_codepoint=127), min_size=1, max_size=64),
        "emitted_at": _valid_instants,
        "threshold": st.none() | st.floats(0, 1),
    }
)
_weird = {
    "edge_id": _identifiers,
    "machine_id": _identifiers,
    "seq": _numbers,
    "window_start": st.one_of(_instants, _numbers),
    "window_end": st.one_of(_instants, _numbers),
    "horizon_h": _numbers,
    "risk": st.dictionaries(_identifiers.filter(lambda k: isinstance(k, str)), _numbers, max_size=3),
    "model_version": st.one_of(st.text(max_size=70), _numbers),
    "emitted_at": st.one_of(_instants, _numbers),
    "threshold": _numbers,
    "schema_version": _numbers,
}


@settings(max_examples=500, deadline=None)
@given(
    fields=_valid,
    changed=st.sampled_from([None, *_weird]),
    dropped=st.sampled_from([None, "emitted_at", "threshold", "schema_version", "seq", "risk"]),
    data=st.data(),
)
def test_any_message_is_read_fast_only_as_the_contract_reads_it(
    fields: dict[str, Any], changed: str | None, dropped: str | None, data: st.DataObject
) -> None:
    """A valid message with one field given any value, or one left out."""
    if changed is not None:
        fields[changed] = data.draw(_weird[changed])
    if dropped is not None:
        fields.pop(dropped, None)
    _agrees(json.dumps(fields).encode())


@settings(max_examples=300, deadline=None)
@given(at=st.integers(0, 400), cut=st.integers(0, 3), insert=st.binary(max_size=4))
def test_a_damaged_record_is_read_fast_only_as_the_contract_reads_it(at: int, cut: int, insert: bytes) -> None:
    value = encode(Prediction.model_validate(_plain()))
    at = min(at, len(value))
    _agrees(value[:at] + insert + value[at + cut :])


def test_the_parser_decides_as_the_contract_alone_does() -> None:
    values = [encode(Prediction.model_validate(_plain(seq))) for seq in range(5)]
    values += [json.dumps(_plain(seq=-1)).encode(), b"{", json.dumps(_plain(reasons=[{"kind": "x"}])).encode()]
    records = [KafkaRecord("t.predictions", 1, i, b"k", v, 0) for i, v in enumerate(values)]
    c = IngestPredictions
    fast = ParseMessages(c.model, c.to_record, c.event_time, c.counter_prefix)
    slow = ParseMessages(c.model, c.to_record, c.event_time, c.counter_prefix)
    slow._from_bytes = None  # the contract alone
    for record in records:
        a, b = fast.read(record), slow.read(record)
        if isinstance(b, DeadLetter):
            assert isinstance(a, DeadLetter) and a.reason == b.reason
        else:
            assert repr(a) == repr(b)
