"""The store file says which schema it was brought to, so a writing connection runs the DDL only when it must."""

from __future__ import annotations

from pathlib import Path

import duckdb

from precursor.store.db import SCHEMA_DIGEST, connect


def _tables(path: Path) -> set[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_a_new_store_gets_the_schema_and_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    with connect(path) as con:
        assert con.execute("SELECT digest FROM store_schema").fetchall() == [(SCHEMA_DIGEST,)]
    assert {"predictions", "events", "alerts", "consumed_ranges", "store_schema"} <= _tables(path)


def test_a_current_store_is_not_altered_and_a_stale_one_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    with connect(path):
        pass
    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE drift")
    with connect(path):
        pass
    assert "drift" not in _tables(path)  # the digest said current: no DDL ran

    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE store_schema SET digest = 'an-older-schema'")
    with connect(path) as con:
        assert con.execute("SELECT digest FROM store_schema").fetchall() == [(SCHEMA_DIGEST,)]
    assert "drift" in _tables(path)


def test_a_store_from_before_the_digest_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    with duckdb.connect(str(path)) as con:  # an older store: a predictions table and nothing else
        con.execute("CREATE TABLE predictions (edge_id VARCHAR NOT NULL, seq BIGINT NOT NULL, machine_id VARCHAR)")
    with connect(path):
        pass
    assert {"predictions", "events", "store_schema"} <= _tables(path)
