"""Sources: a rotation-safe file tail, file replay (CSV, JSONL, Parquet) and the simulator, each resumable from the
position the agent saves."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from edge_agent.config import EdgeConfig, InputSpec, ReplaySource, SimulatorSource, TailSource
from edge_agent.parsing import Reading
from edge_agent.sources import FileReplay, SimulatedFleet
from edge_agent.tail import FileTail
from edge_agent.telemetry_source import SourceBatch
from precursor.contracts.formats import RowError
from precursor.contracts.messages import Event
from tests.fixtures_edge import wait_for

HEADER = "timestamp,machine_id,temp\n"


def line(i: int) -> str:
    return f"{1767225600 + i},m1,{i}\n"


class Follower:
    """Runs a source's batches in a thread and keeps what it yields (the last position included)."""

    def __init__(self, source: FileTail, position: str | None = None) -> None:
        self.batches: list[SourceBatch] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=lambda: self.batches.extend(source.batches(position, self.stop)), daemon=True
        )
        self.thread.start()

    def values(self) -> list[float]:
        return [item.values[0] for b in self.batches for item in b.items if isinstance(item, Reading)]

    def until(self, count: int) -> list[float]:
        wait_for(lambda: len(self.values()) >= count, 10, what=f"{count} readings")
        return self.values()

    def close(self) -> str | None:
        self.stop.set()
        self.thread.join(5)
        positions = [b.position for b in self.batches if b.position is not None]
        return positions[-1] if positions else None


def tail(path: Path, **overrides: object) -> FileTail:
    return FileTail(TailSource(path=path, poll=timedelta(milliseconds=20), **overrides))


def test_tail_hands_over_complete_lines_only_and_follows_appends(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + line(0) + line(1) + "17672256")  # the writer is mid-line
    follower = Follower(tail(path))
    assert follower.until(2) == [0, 1]
    with path.open("a") as fh:
        fh.write("02,m1,2\n" + line(3))
    assert follower.until(4) == [0, 1, 2, 3]
    position = json.loads(follower.close() or "{}")
    assert position["offset"] == path.stat().st_size


def test_tail_survives_rename_rotation_and_truncation_without_loss_or_repeats(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + line(0) + line(1))
    follower = Follower(tail(path))
    follower.until(2)
    with path.open("a") as fh:
        fh.write(line(2) + line(3).rstrip("\n"))  # the last line of the old file has no newline
    path.rename(tmp_path / "t.csv.1")
    path.write_text(HEADER + line(4))
    assert follower.until(5) == [0, 1, 2, 3, 4]
    path.write_text(HEADER + line(5))  # copytruncate: same file, shorter than what was read
    assert follower.until(6) == [0, 1, 2, 3, 4, 5]
    follower.close()


def test_tail_resumes_after_a_restart_even_if_the_file_rotated_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + line(0) + line(1))
    first = Follower(tail(path))
    first.until(2)
    position = first.close()
    # While the agent is down: more lines, then a rotation, then a new file.
    with path.open("a") as fh:
        fh.write(line(2) + line(3))
    path.rename(tmp_path / "t.csv.1")
    path.write_text(HEADER + line(4))
    second = Follower(tail(path), position)
    assert second.until(3) == [2, 3, 4]
    second.close()


def test_tail_quarantines_bad_lines_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        b'{"timestamp": 1767225600, "machine_id": "m1", "temp": 1}\n'
        b"\xff\xfe not utf-8\n"
        b'{"timestamp": 1767225660, "machine_id": "m1", "temp": "x"}\n' + b"x" * 100 + b"\n"
        b'{"timestamp": 1767225720, "machine_id": "m1", "temp": 3}\n'
    )
    follower = Follower(tail(path, batch_rows=2), None)
    wait_for(lambda: len(follower.values()) == 2, 10, what="two good readings")
    follower.close()
    errors = [i.reason for b in follower.batches for i in b.items if isinstance(i, RowError)]
    assert follower.values() == [1.0, 3.0]
    assert any("not valid UTF-8" in e for e in errors)
    assert any("sensor temp='x' is text" in e for e in errors)
    assert any("not valid JSON" in e for e in errors)


def test_tail_skips_a_line_longer_than_the_record_limit(tmp_path: Path) -> None:
    from edge_agent.config import InputSpec

    path = tmp_path / "t.csv"
    path.write_text(HEADER + line(0) + "9" * 300_000 + "\n" + line(1))
    source = FileTail(TailSource(path=path, poll=timedelta(milliseconds=20)), InputSpec(max_record_bytes=1024))
    follower = Follower(source)
    assert follower.until(2) == [0, 1]
    follower.close()
    errors = [i.reason for b in follower.batches for i in b.items if isinstance(i, RowError)]
    assert len(errors) == 1 and "longer than max_record_bytes=1024" in errors[0]


def test_replay_reads_jsonl_and_parquet_and_resumes_from_a_saved_position(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps({"timestamp": 1767225600 + 60 * i, "machine_id": "m1", "temp": i}) + "\n" for i in range(10))
    )
    table = pa.table(
        {
            "timestamp": pa.array([1767225600 + 60 * i for i in range(4)], pa.int64()),
            "machine_id": ["m1"] * 4,
            "temp": [1.0, float("nan"), None, float("inf")],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    parquet = list(FileReplay(ReplaySource(telemetry=tmp_path / "t.parquet")))
    assert [type(i).__name__ for i in parquet] == ["Reading", "Reading", "Reading", "RowError"]

    spec = ReplaySource(telemetry=tmp_path / "t.jsonl", batch_rows=3)
    first = FileReplay(spec).batches(None, threading.Event())
    got = [next(first), next(first)]
    assert got[-1].position == json.dumps({"items": 6})
    rest = list(FileReplay(spec).batches(got[-1].position, threading.Event()))
    values = [i.values[0] for b in got + rest for i in b.items]
    assert values == [float(i) for i in range(10)]


def test_simulator_resumes_the_same_deterministic_stream(tmp_path: Path) -> None:
    spec = SimulatorSource(machines=3, duration="6h", interval="10m", seed=3, speedup=0, batch_rows=10)
    whole = [i for b in SimulatedFleet(spec).batches(None, threading.Event()) for i in b.items]
    first = SimulatedFleet(spec).batches(None, threading.Event())
    head = [next(first) for _ in range(4)]
    tail_part = list(SimulatedFleet(spec).batches(head[-1].position, threading.Event()))
    resumed = [i for b in head + tail_part for i in b.items]
    assert len(whole) > 100 and any(isinstance(i, Reading) for i in whole)
    assert resumed == whole
    assert all(isinstance(i, Reading | Event) for i in whole)


def test_tail_and_mqtt_config_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    config = EdgeConfig.from_dict(
        {
            "edge_id": "e",
            "sources": [
                {"type": "tail", "path": "logs/t.csv"},
                {"type": "mqtt", "topics": ["a/#"], "ca_file": "ca.pem", "tls": True},
            ],
        },
        base=tmp_path,
    )
    tail_spec, mqtt_spec = config.sources
    assert tail_spec.path == tmp_path / "logs/t.csv"  # type: ignore[union-attr]
    assert mqtt_spec.ca_file == tmp_path / "ca.pem"  # type: ignore[union-attr]


def test_tail_csv_blocks_give_what_line_by_line_gives_with_crlf_and_bad_lines_in_between(tmp_path: Path) -> None:
    # Lines past the header go in blocks when every line of a read is a usual row, else one by one: the readings,
    # the refusals and their byte offsets must not tell which.
    good = [f"{1767225600 + i},m{i % 3},{i}.5,{i}\r\n" for i in range(3000)]
    bad = ["1767225600,m1,hot,1\r\n", "\xe9t\xe9,m1,1,1\n", "1767225600,m1,1\n", "   \n", "1767225601,m 1,1,1\n"]
    text = "timestamp,machine_id,temp,vib\r\n" + "".join(good[:2000]) + "".join(bad) + "".join(good[2000:])
    path = tmp_path / "t.csv"
    path.write_bytes(text.encode("utf-8") + b"1767229000,m1,\xff,1\n")
    follower = Follower(tail(path))
    follower.until(3000)
    follower.close()
    items = [item for b in follower.batches for item in b.items]
    readings = [i for i in items if isinstance(i, Reading)]
    assert [(r.machine_id, r.t, r.sensors, r.values) for r in readings] == [
        (f"m{i % 3}", 1767225600.0 + i, ("temp", "vib"), (i + 0.5, float(i))) for i in range(3000)
    ]
    errors = [(e.line, e.reason.split(" ")[0]) for e in items if isinstance(e, RowError)]
    offset = len(("timestamp,machine_id,temp,vib\r\n" + "".join(good[:2000])).encode())
    assert errors[0] == (offset, "sensor")
    assert [reason for _, reason in errors] == ["sensor", "timestamp='été'", "has", "machine_id='m", "not"]


# --- a paced replay stopped during a pacing wait ---------------------------------------------------------------------


def test_a_paced_replay_position_counts_only_the_readings_handed_on(tmp_path: Path) -> None:
    """The reading held back during a pacing wait is not in the position: a stop there (SIGTERM) or a kill, then a
    restart from the saved position, reads every reading exactly once (it lost one per stop before)."""
    (tmp_path / "t.csv").write_text(HEADER + "".join(line(i) for i in range(12)))
    spec = ReplaySource(telemetry=tmp_path / "t.csv", speedup=20.0, batch_rows=100)  # a reading every 50 ms
    handed: list[float] = []
    position = None
    for _ in range(20):
        stop = threading.Event()
        for batch in FileReplay(spec).batches(position, stop):
            handed += [i.values[0] for i in batch.items]
            if batch.position is not None:
                position = batch.position
            if batch.items:
                stop.set()  # stops in the pacing wait for the next reading, which is already taken from the file
        if len(handed) >= 12:
            break
    assert handed == [float(i) for i in range(12)]
    assert position == json.dumps({"items": 12})


def test_a_paced_simulator_position_counts_only_the_items_handed_on() -> None:
    spec = SimulatorSource(machines=2, duration="2h", interval="10m", seed=5, speedup=6000.0, batch_rows=50)
    whole = [i for b in SimulatedFleet(spec).batches(None, threading.Event()) for i in b.items]
    got: list[object] = []
    position = None
    for _ in range(len(whole)):  # a stop after each batch: one item a round, at least
        if len(got) >= len(whole):
            break
        stop = threading.Event()
        for batch in SimulatedFleet(spec).batches(position, stop):
            got += batch.items
            position = batch.position or position
            if batch.items:
                stop.set()
    assert got == whole


# --- replay never stops on what a row holds ----------------------------------------------------------------------


def replayed(path: Path, **limits: object) -> list[object]:
    return [
        i
        for b in FileReplay(ReplaySource(telemetry=path), InputSpec(**limits)).batches(None, threading.Event())
        for i in b.items
    ]


def test_replay_reads_a_csv_or_jsonl_file_with_a_byte_order_mark_and_a_blank_first_line(tmp_path: Path) -> None:
    (tmp_path / "bom.csv").write_bytes(("\ufeff" + HEADER + line(0) + line(1)).encode())
    (tmp_path / "blank.csv").write_text("\n" + HEADER + line(0) + line(1))
    (tmp_path / "bom.jsonl").write_bytes(
        (
            "\ufeff"
            + "".join(json.dumps({"timestamp": 1767225600 + i, "machine_id": "m1", "temp": i}) + "\n" for i in range(2))
        ).encode()
    )
    for name in ("bom.csv", "blank.csv", "bom.jsonl"):
        items = replayed(tmp_path / name)
        assert [i.values[0] for i in items if isinstance(i, Reading)] == [0.0, 1.0], (name, items)
        assert not [i for i in items if isinstance(i, RowError)], name


def test_replay_quarantines_a_huge_line_and_bytes_that_are_not_utf8_and_reads_the_rest(tmp_path: Path) -> None:
    huge = f"{1767225600 + 1},m1,{'9' * 5000}\n"
    (tmp_path / "t.csv").write_bytes(
        (HEADER + line(0) + huge + line(2)).encode() + b"1767225603,m\xe91,3\n" + line(4).encode()
    )
    items = replayed(tmp_path / "t.csv", max_record_bytes=1024)
    assert [i.values[0] for i in items if isinstance(i, Reading)] == [0.0, 2.0, 4.0]
    errors = [i for i in items if isinstance(i, RowError)]
    assert [e.line for e in errors] == [3, 5]
    assert "longer than max_record_bytes=1024" in errors[0].reason and "not valid UTF-8" in errors[1].reason
    (tmp_path / "t.jsonl").write_bytes(
        b'{"timestamp": 1767225600, "machine_id": "m1", "temp": 0}\n'
        + b'{"timestamp": 1767225601, "machine_id": "m1", "temp": '
        + b"7" * 5000
        + b"}\n"
        + b'{"timestamp": 1767225602, "machine_id": "m\xe9", "temp": 2}\n'
        + b'{"timestamp": 1767225603, "machine_id": "m1", "temp": 3}'  # no newline at the end
    )
    items = replayed(tmp_path / "t.jsonl")
    assert [i.values[0] for i in items if isinstance(i, Reading)] == [0.0, 3.0]
    assert [type(i).__name__ for i in items] == ["Reading", "RowError", "RowError", "Reading"]


def test_replay_quarantines_a_parquet_row_python_cannot_hold_and_reads_the_rest(tmp_path: Path) -> None:
    table = pa.table(
        {
            "timestamp": pa.array([1767225600, 10**12, 1767225660], pa.timestamp("s")),  # the middle is year 33658
            "machine_id": ["m1"] * 3,
            "temp": [1.0, 2.0, 1e300],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    items = replayed(tmp_path / "t.parquet")
    assert [type(i).__name__ for i in items] == ["Reading", "RowError", "RowError"]
    assert "unreadable Parquet row" in items[1].reason  # type: ignore[union-attr]
    assert "sensor temp=1e+300 is too large" in items[2].reason  # type: ignore[union-attr]


def test_a_paced_replay_does_not_wait_for_a_reading_stamped_in_the_far_future(tmp_path: Path) -> None:
    """The agent quarantines it (past input.max_future); waiting for its time stalled the replay for decades."""
    far = 1767225600 + 50 * 365 * 86400
    (tmp_path / "t.csv").write_text(HEADER + line(0) + f"{far},m1,99\n" + line(1) + line(2))
    spec = ReplaySource(telemetry=tmp_path / "t.csv", speedup=10.0)
    got: list[float] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=lambda: got.extend(i.values[0] for b in FileReplay(spec).batches(None, stop) for i in b.items),
        daemon=True,
    )
    reader.start()
    reader.join(5)
    stop.set()
    assert got == [0.0, 99.0, 1.0, 2.0]


def test_tail_refuses_a_complete_line_over_the_record_limit_as_the_replay_does(tmp_path: Path) -> None:
    """A line over max_record_bytes that arrived whole (within one read) was parsed anyway: here a valid row."""
    path = tmp_path / "t.csv"
    long = f"1767225601,m1,{'1' * 30}.5{'0' * 1100}\n"  # a valid number, 1,100 zeros after the point
    path.write_text(HEADER + line(0) + long + line(2))
    source = FileTail(TailSource(path=path, poll=timedelta(milliseconds=20)), InputSpec(max_record_bytes=1024))
    follower = Follower(source)
    assert follower.until(2) == [0, 2]
    follower.close()
    for items in ([i for b in follower.batches for i in b.items], replayed(path, max_record_bytes=1024)):
        errors = [i for i in items if isinstance(i, RowError)]
        assert len(errors) == 1 and "longer than max_record_bytes=1024" in errors[0].reason
