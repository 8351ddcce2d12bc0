"""A real S3-compatible server for the test session (gofakes3, its own process on a free port), and a prefix of its
bucket per test with the environment pointing at it.

Test modules that need it say ``pytest_plugins = ["tests.fixtures_object_store"]``. The server binary is built once
by ``precursor objects install`` (the test script runs it); a session that finds none builds it here (seconds).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from infra.object_store_server import LocalS3, install_s3_server
from precursor.contracts.object_store import ObjectStoreSettings

SECRET = f"s3-secret-{uuid.uuid4().hex}"
"""The secret key the tests sign with: the server checks none, so the tests can look for it wherever it must not be."""


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    server = LocalS3(tmp_path_factory.mktemp("s3"), binary=install_s3_server())
    server.up()
    yield server
    server.down()


@pytest.fixture
def s3_env(s3_server: LocalS3, monkeypatch: pytest.MonkeyPatch) -> ObjectStoreSettings:
    """The object store settings of the environment (standard AWS variables) point at the session server, as they
    would for a pipeline worker; returns the same settings as an object."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "PRECURSOR_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "precursor-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("PRECURSOR_S3_ADDRESSING_STYLE", "path")
    return ObjectStoreSettings()


@pytest.fixture
def s3_prefix(s3_server: LocalS3) -> str:
    """A fresh prefix of the session bucket for one test."""
    return f"s3://{s3_server.bucket}/t-{uuid.uuid4().hex[:10]}"
