"""Schema-driven fuzzing: schemathesis builds requests from the OpenAPI document, valid and not, and no answer may be a
5xx or differ from what the document promises. The store must be unchanged afterwards.

The live tail is left out: it is an endless stream by design, tested against the real broker in test_api_live.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from tests.fixtures_api import AUTH, NO_BROKER, TOKEN, SimulatedStore, fill_store, serving
from tests.fixtures_store import store_digest

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed_store(new_store: NewStore) -> SimulatedStore:
    return fill_store(new_store("fuzz"), machines=6, days=3)


def _app(store_path: Path | str) -> FastAPI:
    return create_app(
        ApiSettings(tokens=TOKEN, store=store_path, sql_timeout_s=1.0),
        NO_BROKER,
    )


def _schema(store_path: Path) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", _app(store_path))


@pytest.fixture(scope="module")
def served(fuzzed_store: SimulatedStore) -> Iterator[tuple[str, schemathesis.BaseSchema]]:
    """The app behind a real HTTP server, its document loaded from there: every generated request goes over HTTP."""
    with serving(_app(fuzzed_store.path)) as base:
        yield base, schemathesis.openapi.from_url(f"{base}/openapi.json")


# The operations, read from the document itself (the store path does not change the document).
OPERATIONS = sorted(
    (op.ok().method.upper(), op.ok().path)
    for op in _schema(Path("unused.duckdb")).get_all_operations()
    if op.ok().path != "/api/v1/live"
)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_generated_request_makes_the_api_fail(
    method: str, path: str, fuzzed_store: SimulatedStore, served: tuple[str, schemathesis.BaseSchema]
) -> None:
    base, schema = served
    operation = schema[path][method]
    before = store_digest(fuzzed_store.path)

    @given(case=operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE))
    @settings(
        max_examples=16,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=base, headers=AUTH, timeout=30)
        case.validate_response(response, checks=CHECKS)

    fuzz()
    assert store_digest(fuzzed_store.path) == before
