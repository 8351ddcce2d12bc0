"""Message contracts: round trips, and errors that name the field and the value."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from precursor.contracts import ContractError, EdgeEvent, KafkaSettings, Prediction, TelemetryReading, decode, encode
from precursor.contracts.formats import RowError, iter_telemetry, parse_timestamp

PREDICTION = {
    "edge_id": "edge-1",
    "seq": 3,
    "machine_id": "pump-1",
    "window_start": "2026-01-01T00:00:00Z",
    "window_end": "2026-01-01T06:00:00+00:00",
    "horizon_h": 24,
    "risk": {"failure": 0.4, "bearing": 0.3},
    "model_name": "lm",
    "model_version": "2026.1",
}


def test_prediction_round_trip_keeps_every_field() -> None:
    p = decode(Prediction, json.dumps(PREDICTION))
    assert decode(Prediction, encode(p)) == p
    assert p.window_end == datetime(2026, 1, 1, 6, tzinfo=UTC)
    assert p.schema_version == 1
    assert p.max_risk == 0.4


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("risk", {"failure": 1.7}, "risk.failure=1.7"),
        ("seq", -1, "seq=-1"),
        ("seq", "three", "seq='three'"),
        ("machine_id", "", "machine_id=''"),
        ("window_start", "2026-01-01T00:00:00", "window_start="),  # naive time: ambiguous on an edge box
        ("horizon_h", float("nan"), "horizon_h=nan"),
        ("window_end", "2025-12-31T00:00:00Z", "is before window_start"),
    ],
)
def test_bad_prediction_error_names_field_and_value(field: str, value: object, named: str) -> None:
    with pytest.raises(ContractError) as err:
        decode(Prediction, json.dumps({**PREDICTION, field: value}))
    assert named in str(err.value)


def test_unknown_fields_and_wrong_schema_version_are_refused() -> None:
    with pytest.raises(ContractError, match="surprise"):
        decode(Prediction, json.dumps({**PREDICTION, "surprise": 1}))
    with pytest.raises(ContractError, match="schema_version=2"):
        decode(Prediction, json.dumps({**PREDICTION, "schema_version": 2}))


REASON = {
    "kind": "sensor",
    "name": "vibration_rms",
    "risk_drop": 0.31,
    "detail": {"statistic": "std", "from_h": 6, "to_h": 0},
    "text": "vibration_rms spread over the last 6 h",
}


def test_reasons_are_optional_round_trip_and_bounded() -> None:
    assert decode(Prediction, json.dumps(PREDICTION)).reasons is None  # an older edge's message stays valid
    p = decode(
        Prediction,
        json.dumps(
            {
                **PREDICTION,
                "reasons": [
                    REASON,
                    {
                        **REASON,
                        "kind": "event",
                        "name": "error:E310",
                        "detail": {"count": 3},
                        "text": "error E310 three times",
                    },
                ],
            }
        ),
    )
    assert decode(Prediction, encode(p)) == p
    assert p.reasons is not None and p.reasons[0].detail is not None and p.reasons[0].detail.statistic == "std"
    with pytest.raises(ContractError, match="reasons"):
        decode(Prediction, json.dumps({**PREDICTION, "reasons": [REASON] * 9}))
    with pytest.raises(ContractError, match=r"reasons\.0\.kind"):
        decode(Prediction, json.dumps({**PREDICTION, "reasons": [{**REASON, "kind": "hunch"}]}))
    with pytest.raises(ContractError, match=r"reasons\.0\.text"):
        decode(Prediction, json.dumps({**PREDICTION, "reasons": [{**REASON, "text": "x" * 201}]}))


def test_not_json_and_not_an_object() -> None:
    with pytest.raises(ContractError, match="not valid JSON"):
        decode(Prediction, b"\xff{")
    with pytest.raises(ContractError, match="expected a JSON object, got list"):
        decode(Prediction, b"[1, 2]")


def test_edge_event_carries_idempotency_key_and_parses_kind() -> None:
    e = EdgeEvent(edge_id="e", seq=1, timestamp="2026-01-01T00:00:00Z", machine_id="m", event="maintenance:bearing")
    assert (e.kind, e.detail) == ("maintenance", "bearing")
    with pytest.raises(ValueError, match="event"):
        EdgeEvent(edge_id="e", seq=1, timestamp="2026-01-01T00:00:00Z", machine_id="m", event="exploded")


def test_readings_refuse_non_finite_values() -> None:
    with pytest.raises(ValueError, match="not finite: temp"):
        TelemetryReading(timestamp=datetime.now(UTC), machine_id="m", values={"temp": float("inf")})


def test_generic_rows_become_readings_or_row_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "t.csv"
    path.write_text(
        "timestamp,machine_id,temp,vib\n"
        "2026-01-01T00:00:00Z,m1,20.5,\n"  # a blank is a missing reading
        "1767225660,m1,21,0.1\n"  # epoch seconds
        "not-a-time,m1,1,2\n"
        "2026-01-01T00:02:00Z,m1,hot,2\n"
        "2026-01-01T00:03:00Z,m1,1\n"
    )
    items = list(iter_telemetry(path))
    readings = [i for i in items if isinstance(i, TelemetryReading)]
    errors = [i for i in items if isinstance(i, RowError)]
    assert [r.values for r in readings] == [{"temp": 20.5, "vib": None}, {"temp": 21.0, "vib": 0.1}]
    assert readings[1].timestamp == parse_timestamp("2026-01-01T00:01:00Z")
    assert [(e.line, e.reason) for e in errors] == [
        (4, "timestamp 'not-a-time' is neither ISO 8601 nor epoch seconds"),
        (5, "sensor temp='hot' is not a number"),
        (6, "has 3 fields, the header has 4"),
    ]


def test_kafka_security_is_configuration_and_secrets_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("PRECURSOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("PRECURSOR_KAFKA_SASL_PLAIN_USERNAME", "edge")
    monkeypatch.setenv("PRECURSOR_KAFKA_SASL_PLAIN_PASSWORD", "s3cret")
    monkeypatch.setenv("PRECURSOR_KAFKA_SSL_CAFILE", "/etc/ca.pem")
    s = KafkaSettings()
    kwargs = s.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_plain_password"] == "s3cret"
    assert kwargs["ssl_cafile"] == "/etc/ca.pem"
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump())
    with pytest.raises(ValueError, match="needs sasl_mechanism"):
        KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism=None)
