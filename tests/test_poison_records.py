"""Records of any size or content: every consumer reads them or dead-letters them, and always moves on.

The reproduction: a 900 KB non-JSON message on the predictions topic became a dead letter (base64 of the raw bytes)
larger than the producer's 1 MB limit, so the run failed before committing its offsets, and every rerun met it again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apache_beam import pvalue
from apache_beam.transforms.window import TimestampedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer

from pipelines.ingest import DEAD, IngestEvents, IngestPredictions, ParseMessages
from pipelines.kafka_io import KafkaRecord
from pipelines.run import run_once
from precursor.api.live import KafkaTail
from precursor.contracts.messages import (
    MAX_DEAD_LETTER_RAW_BYTES,
    ContractError,
    DeadLetter,
    EdgeEvent,
    Heartbeat,
    ModelRelease,
    Prediction,
    decode,
    encode,
)
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect

PRODUCER_LIMIT = 1_048_576  # kafka-python's default max_request_size, and about the broker's default record limit

GOOD = Prediction(
    edge_id="edge-p",
    seq=1,
    machine_id="pump-1",
    window_start="2026-03-01T00:00:00Z",
    window_end="2026-03-01T06:00:00Z",
    horizon_h=24,
    risk={"failure": 0.4},
    model_name="lm",
    model_version="1",
)


def _poison() -> dict[str, bytes]:
    """The records that broke consumers, and their relatives."""
    good = json.loads(encode(GOOD))
    return {
        "900 KB of non-JSON": b"\xff" + b"x" * 900_000,
        "a 5,000-digit number": encode(GOOD).replace(b'"seq":1', b'"seq":' + b"9" * 5000),
        "a 400-digit seq": encode(GOOD).replace(b'"seq":1', b'"seq":' + b"7" * 400),
        "a seq past int64": encode(GOOD).replace(b'"seq":1', b'"seq":' + str(2**64).encode()),
        "nesting 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
        "a huge bad risk map": json.dumps(good | {"risk": {f"k{i}": "high" for i in range(40_000)}}).encode(),
        "1e999 as risk": encode(GOOD).replace(b'"failure":0.4', b'"failure":1e999'),
        "invalid UTF-8": b'{"edge_id": "\xc3\x28"}',
        "a JSON list": b"[1, 2, 3]",
        "empty": b"",
    }


# --- every record gives exactly one output, and a dead letter always fits the producer ---------------------------


def _outputs(model: type, parse: ParseMessages, value: bytes | None, key: bytes | None = b"k") -> list:
    return list(parse.process(KafkaRecord("t.predictions", 0, 7, key, value, 0)))


def _check_one_output(outputs: list, value: bytes | None) -> None:
    assert len(outputs) == 1
    out = outputs[0]
    if isinstance(out, pvalue.TaggedOutput):
        assert out.tag == DEAD
        letter: DeadLetter = out.value
        wire = encode(letter)
        assert len(wire) < PRODUCER_LIMIT // 2, f"a dead letter of {len(wire)} bytes would not fit"
        raw = value or b""
        assert letter.raw_size == len(raw) and letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
        kept = base64.b64decode(letter.raw_b64)
        assert raw.startswith(kept) and letter.truncated == (len(kept) < len(raw))
        assert len(kept) == min(len(raw), MAX_DEAD_LETTER_RAW_BYTES)
        assert decode(DeadLetter, wire) == letter  # it reads back
    else:
        assert isinstance(out, TimestampedValue)


PARSERS = [
    (c.model, ParseMessages(c.model, c.to_record, c.event_time, c.counter_prefix))
    for c in (IngestPredictions, IngestEvents)
]


@pytest.mark.parametrize("name", list(_poison()))
def test_each_poison_record_is_dead_lettered_with_a_reason_that_fits(name: str) -> None:
    value = _poison()[name]
    for model, parse in PARSERS:
        outputs = _outputs(model, parse, value)
        _check_one_output(outputs, value)
        assert isinstance(outputs[0], pvalue.TaggedOutput), f"{name} was accepted as a {model.__name__}"
        assert outputs[0].value.reason.startswith(model.__name__)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head=st.binary(max_size=64),
    filler=st.sampled_from([b"", b"x", b"\x00", b"9", b"[", b'{"a":', b"\xff\xfe"]),
    size=st.sampled_from([0, 1, 100, 70_000, 300_000, 900_000, 3_000_000]),
    key=st.one_of(st.none(), st.binary(max_size=16), st.just(b"k" * 200_000)),
)
def test_any_bytes_of_any_size_give_one_output_and_a_dead_letter_that_fits(
    head: bytes, filler: bytes, size: int, key: bytes | None
) -> None:
    value = head + filler * size
    for model, parse in PARSERS:
        _check_one_output(_outputs(model, parse, value, key), value)


_extremes = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([2**63, 2**63 - 1, -1, 10**4000, 1e308, -1e308, 5e-324]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(sorted(json.loads(encode(GOOD)))), value=_extremes)
def test_a_prediction_with_any_value_in_any_field_is_stored_or_dead_lettered(field: str, value: object) -> None:
    data = json.loads(encode(GOOD)) | {field: value}
    try:
        raw = json.dumps(data).encode()
    except ValueError:  # an integer past Python's digit limit: write the digits ourselves
        raw = json.dumps(data | {field: "__N__"}).encode().replace(b'"__N__"', str(value).encode())
    model, parse = PARSERS[0]
    _check_one_output(_outputs(model, parse, raw), raw)


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=2048))
def test_decode_raises_nothing_but_a_contract_error(raw: bytes) -> None:
    for model in (Prediction, EdgeEvent, Heartbeat, ModelRelease, DeadLetter):
        with contextlib.suppress(ContractError):
            decode(model, raw)


# --- through the real broker ------------------------------------------------------------------------------------


def _send(settings: KafkaSettings, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all", max_request_size=PRODUCER_LIMIT)
    for value in values:
        producer.send(topic, key=b"pump-1", value=value)
    producer.flush()
    producer.close()


def _good(seq: int) -> bytes:
    end = datetime(2026, 3, 1, 6, tzinfo=UTC) + timedelta(hours=seq)
    return encode(GOOD.model_copy(update={"seq": seq, "window_start": end - timedelta(hours=6), "window_end": end}))


@pytest.mark.integration
def test_poison_records_do_not_wedge_ingest(tmp_path: Path, kafka_settings: KafkaSettings) -> None:
    poison = _poison()
    values = [_good(1), *poison.values(), _good(2)]
    _send(kafka_settings, kafka_settings.topics.predictions, values)
    store = tmp_path / "store.duckdb"

    report = run_once(kafka_settings, store)

    assert (report.read, report.stored, report.dead_lettered) == (len(values), 2, len(poison))
    assert run_once(kafka_settings, store).read == 0  # the offsets were committed: nothing is met again
    with connect(store, read_only=True) as con:
        assert con.execute("SELECT list(seq ORDER BY seq) FROM predictions").fetchone()[0] == [1, 2]
    consumer = KafkaConsumer(
        kafka_settings.topics.deadletter,
        **kafka_settings.client_kwargs(),
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    letters = [decode(DeadLetter, record.value) for record in consumer]
    consumer.close()
    hashes = sorted(hashlib.sha256(v).hexdigest() for v in poison.values())
    assert sorted(letter.raw_sha256 for letter in letters) == hashes
    big = next(letter for letter in letters if letter.raw_size == len(poison["900 KB of non-JSON"]))
    assert big.truncated and "not valid JSON" in big.reason


@pytest.mark.integration
def test_the_live_tail_moves_past_poison_records(kafka_settings: KafkaSettings) -> None:
    poison = _poison()
    _send(kafka_settings, kafka_settings.topics.predictions, [*poison.values(), _good(3)])
    tail = KafkaTail(kafka_settings, ["predictions"], "earliest", poll_ms=500)
    tail.open()
    seen = []
    try:
        for _ in range(40):
            for record in tail.poll():
                seen.append(record)
                tail.advance(record)
            if len(seen) > len(poison):
                break
    finally:
        tail.close()
    assert len(seen) == len(poison) + 1
    assert [r.message for r in seen[:-1]] == [None] * len(poison)
    assert isinstance(seen[-1].message, Prediction) and seen[-1].message.seq == 3


@pytest.mark.integration
def test_valid_records_at_the_contract_extremes_are_stored_and_ingest_goes_on(
    tmp_path: Path, kafka_settings: KafkaSettings
) -> None:
    long_ago, far_ahead = datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)
    extremes = [
        GOOD.model_copy(update={"seq": 2**63 - 1, "window_start": long_ago, "window_end": long_ago}),
        GOOD.model_copy(update={"seq": 5, "window_start": far_ahead, "window_end": far_ahead, "emitted_at": far_ahead}),
        GOOD.model_copy(update={"seq": 6, "risk": {f"kind-{i}": 1.0 for i in range(2000)}, "horizon_h": 24 * 365}),
        GOOD.model_copy(update={"seq": 7, "risk": {"failure": 5e-324}, "threshold": 1.0}),
    ]
    _send(kafka_settings, kafka_settings.topics.predictions, [encode(p) for p in extremes] + [_good(8)])
    store = tmp_path / "store.duckdb"

    report = run_once(kafka_settings, store)

    assert (report.read, report.dead_lettered) == (5, 0)
    assert report.stored == 5
    assert run_once(kafka_settings, store).read == 0
