"""The ledger of consumed Kafka offsets commits with the rows it accounts for, on DuckDB and on PostgreSQL: a write
that fails after its rows but before its offsets leaves neither; the next run's starting point and skips come from
what committed; a finished run folds the ledger into the consumer's offsets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.ingest import event_batch
from precursor.store import Offset, PredictionStore
from precursor.store.db import StoreWriter
from precursor.store.ledger import Coverage, consumed, contains, count, intersect, prefix_end, spans_of, union
from precursor.store.queries import reading
from precursor.store.runs import consumer_positions

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]

TOPIC = "t.events"


def events(offsets: list[int]) -> pa.Table:
    """Event rows whose seq is their offset (partition 0), as ingest writes them."""
    at = 1_767_225_600_000_000
    return event_batch([("e1", o, "pump-1", at + o, "failure:bearing", 0, o) for o in offsets], datetime.now(UTC))


def counts(location: object) -> tuple[int, int]:
    with reading(location) as store:  # type: ignore[arg-type]
        rows = store.rows("SELECT count(*) AS n FROM events")[0]["n"]
        ledger = store.rows("SELECT count(*) AS n FROM consumed_ranges")[0]["n"]
    return int(rows), int(ledger)


def test_rows_and_their_offsets_commit_together_or_not_at_all(new_store: NewStore) -> None:
    location = new_store("ledger")
    store = PredictionStore(location)
    # A ledger row the database refuses (no consumer: NOT NULL), written after the rows in the same transaction.
    refused = Coverage((None,), TOPIC, {0: [(0, 5)]})  # type: ignore[arg-type]
    with pytest.raises(Exception, match=r"(?i)null"):
        store.insert_table("events", events([0, 1, 2, 3, 4]), covers=refused)
    assert counts(location) == (0, 0)  # the rows went in first, and went with the failed offsets
    assert store.consumed("ingest", TOPIC) == {}

    good = Coverage.of(["ingest"], TOPIC, [(0, o) for o in range(5)])
    assert store.insert_table("events", events([0, 1, 2, 3, 4]), covers=good) == 5
    assert counts(location) == (5, 1)
    assert store.consumed("ingest", TOPIC) == {0: [(0, 5)]}


def test_the_next_start_is_the_consumed_prefix_and_a_record_counts_once_every_stage_has_it(
    new_store: NewStore,
) -> None:
    location = new_store("stages")
    store = PredictionStore(location)
    stages = ("ingest", "ingest/alerts")
    store.insert_table("events", events([0, 1, 2, 6, 7]), covers=Coverage.of(stages[:1], TOPIC, [(0, 0), (0, 1)]))
    store.insert_table("events", pa.table({}), covers=Coverage.of(stages[:1], TOPIC, [(0, 2), (0, 6), (0, 7)]))
    store.insert_table("events", pa.table({}), covers=Coverage.of(stages[1:], TOPIC, [(0, o) for o in range(8)]))
    # Stored 0-2 and 6-7, decided 0-7: consumed where both are.
    assert store.consumed("ingest", TOPIC, stages) == {0: [(0, 3), (6, 8)]}
    assert prefix_end(store.consumed("ingest", TOPIC, stages)[0], 0) == 3

    # A finished run folds in: the offsets move, the ledger rows below them go, those above stay.
    store.commit_offsets("ingest", [Offset(TOPIC, 0, 7)], stages=stages)
    assert store.offsets("ingest", TOPIC) == {0: 7}
    assert store.consumed("ingest", TOPIC, stages) == {0: [(0, 8)]}
    store.commit_offsets("ingest", [Offset(TOPIC, 0, 8)], stages=stages)
    assert counts(location)[1] == 0
    store.commit_offsets("ingest", [Offset(TOPIC, 0, 3)], stages=stages)
    assert store.offsets("ingest", TOPIC) == {0: 8}  # never backwards


def test_the_position_a_status_shows_counts_what_a_killed_run_stored_and_decided(new_store: NewStore) -> None:
    """A run killed after most of its writes: ``precursor status`` reads the consumer as far as the next run will
    start (folded offsets, extended by the ledger where every stage has the records), not where the last finished
    run left it."""
    location = new_store("positions")
    store = PredictionStore(location)
    stages = ("ingest", "ingest/alerts")
    store.commit_offsets("ingest", [Offset(TOPIC, 0, 4), Offset(TOPIC, 1, 2)], stages=stages)
    # Partition 0: stored 4-11 and decided 4-8; partition 1: stored 2-5, not decided yet.
    store.insert_table("events", pa.table({}), covers=Coverage.of(stages[:1], TOPIC, [(0, o) for o in range(4, 12)]))
    store.insert_table("events", pa.table({}), covers=Coverage.of(stages[1:], TOPIC, [(0, o) for o in range(4, 9)]))
    store.insert_table("events", pa.table({}), covers=Coverage.of(stages[:1], TOPIC, [(1, o) for o in range(2, 6)]))
    with reading(location) as reader:
        assert consumer_positions(reader, "ingest") == {(TOPIC, 0): 4, (TOPIC, 1): 2}  # folded only
        assert consumer_positions(reader, "ingest", {TOPIC: stages}) == {(TOPIC, 0): 9, (TOPIC, 1): 2}
        assert consumer_positions(reader, "ingest", {TOPIC: stages[:1]}) == {(TOPIC, 0): 12, (TOPIC, 1): 6}
        assert consumer_positions(reader, "ingest", {"other-topic": stages}) == {(TOPIC, 0): 4, (TOPIC, 1): 2}


def test_a_writer_keeps_its_connection_on_postgresql_and_lets_a_duckdb_file_go_after_each_write(
    new_store: NewStore,
) -> None:
    location = new_store("writer")
    writer = StoreWriter(location)
    try:
        writer.insert_table("events", events([0]), covers=Coverage.of(["ingest"], TOPIC, [(0, 0)]))
        first = writer._con
        writer.cover(Coverage.of(["ingest"], TOPIC, [(0, 1)]))
        writer.insert_table("events", events([2]), covers=Coverage.of(["ingest"], TOPIC, [(0, 2)]))
        if isinstance(location, str):
            assert first is not None and writer._con is first  # PostgreSQL: one connection for the writer's life
        else:
            assert first is None and writer._con is None  # DuckDB: the file is free between writes
            with duckdb.connect(str(location)) as other:  # as another process would open it
                assert other.execute("SELECT count(*) FROM events").fetchone() == (2,)
    finally:
        writer.close()
    assert counts(location) == (2, 3)
    assert PredictionStore(location).consumed("ingest", TOPIC) == {0: [(0, 3)]}


spans = st.lists(st.integers(0, 60), max_size=40).map(spans_of)


@given(spans, spans)
def test_span_arithmetic_agrees_with_sets_of_offsets(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    def offsets(s: list[tuple[int, int]]) -> set[int]:
        return {o for start, end in s for o in range(start, end)}

    assert offsets(union(a, b)) == offsets(a) | offsets(b)
    assert offsets(intersect(a, b)) == offsets(a) & offsets(b)
    assert all(contains(a, o) == (o in offsets(a)) for o in range(62))
    assert count(a, 10, 30) == len({o for o in offsets(a) if 10 <= o < 30})
    end = prefix_end(a, 0)
    assert set(range(end)) <= offsets(a) and end not in offsets(a)
    folded = consumed({0: 5}, [[(0, "-".join(map(str, s))) for s in a]])
    assert offsets(folded.get(0, [])) == offsets(a) | set(range(5))
