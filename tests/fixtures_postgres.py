"""One real PostgreSQL server for the test session (initdb, pg_ctl, a free port), a fresh database per store, and the
store backend a module runs against.

A test module says ``pytest_plugins = ["tests.fixtures_postgres"]`` and asks for ``new_store``: its tests then run
once per backend, DuckDB (a file) and PostgreSQL (a database made for the store, so modules never see each other's
rows).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.postgres_server import LocalPostgres

BACKENDS = ("duckdb", "postgresql")

NewStore = Callable[[str], Path | str]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    # Not under pytest's temporary folder: that one is private to the user, and a server started by root runs as the
    # postgres account, which must reach its data.
    root = Path(tempfile.mkdtemp(prefix="precursor-pg-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "pg")
    server.up(report=lambda _: None)
    before = os.environ.get("PGPASSFILE")
    os.environ["PGPASSFILE"] = str(server.pgpass)  # libpq's password, as a deployment gives it
    try:
        yield server
    finally:
        if before is None:
            os.environ.pop("PGPASSFILE", None)
        else:
            os.environ["PGPASSFILE"] = before
        server.down(report=lambda _: None, immediate=True)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(server: LocalPostgres, name: str = "store") -> str:
    """The URL of a new, empty database on ``server``."""
    return server.create_database(f"{name}_{uuid.uuid4().hex[:10]}".lower())


@pytest.fixture(scope="module", params=BACKENDS)
def store_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def new_store(store_backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> NewStore:
    """Makes an empty store of the module's backend: a DuckDB file path, or a PostgreSQL URL."""
    if store_backend == "duckdb":
        return lambda name: tmp_path_factory.mktemp(name) / "store.duckdb"
    server: LocalPostgres = request.getfixturevalue("postgres_server")
    return lambda name: fresh_database(server, name)
