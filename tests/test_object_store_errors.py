"""An object store that refuses or cannot be reached ends each path that uses it with one line naming the URL, the
endpoint, what failed and the variable to check, never the secret, and loses nothing.

Against the real S3 server of the test session (gofakes3): a bucket that does not exist, and an endpoint where
nothing listens. gofakes3 checks no credentials, so the credential cases go through a front that verifies each
request's signature as S3 does (:mod:`tests.s3_signature_front`) and answers ``InvalidAccessKeyId`` or
``SignatureDoesNotMatch`` like S3; what verifies goes on to the server. The paths: ``precursor pipeline label``,
``precursor pipeline monitor`` and ``precursor flows run retrain`` (dataset and registry on s3://) as the CLI runs
them, the registry, the retrain's dataset reader and the ingest's list of releases as the code calls them, and an
edge fetching a release, which keeps serving its model and takes the release once the settings are right. A key
that may read objects but not list them still fetches a packed release.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge_agent.config import EdgeConfig
from edge_agent.scorers import RunningModel, ScorerSlot
from edge_agent.updates import ModelUpdater
from flows.labeled import field_labels
from infra.object_store_server import LocalS3
from infra.prefect_server import OFFLINE_ENVIRONMENT
from infra.processes import free_ports
from models.edge.baselines import DriftZScore
from models.edge.object_registry import open_registry
from models.edge.registry import pack, release_for
from models.edge.releases import ReleaseSigner
from models.edge.signing import generate_keypair, load_private_key, load_public_keys
from pipelines.edge_trust import release_hashes
from precursor.cli import app
from precursor.contracts.messages import ModelRelease
from precursor.contracts.object_store import ObjectStoreAccessError, ObjectStoreSettings, explain, filesystem
from tests.fixtures_edge import build_artifact, training_windows
from tests.s3_signature_front import SignatureCheckingFront
from tests.test_pipeline_labeling import FleetHistory, steady, store_history

pytest_plugins = ["tests.fixtures_object_store"]

KEY_ID = "precursor-test"
SECRET = f"s3-secret-{uuid.uuid4().hex}"
"""The one secret the front takes for ``KEY_ID``."""
READER_ID, READER_SECRET = "edge-reader", f"reader-secret-{uuid.uuid4().hex}"
"""A key whose policy lets it read objects but not list them (``s3:GetObject`` only), as an edge's may be."""
LISTER_ID, LISTER_SECRET = "dashboard", f"lister-secret-{uuid.uuid4().hex}"
"""A read-only key: it may list and read but not write (a key meant for dashboards, given to a writer by mistake)."""
WRONG_SECRET = f"wrong-secret-{uuid.uuid4().hex}"
SENSORS = ("pressure", "temp", "vib")


@pytest.fixture(scope="module")
def front(s3_server: LocalS3) -> Iterator[SignatureCheckingFront]:
    keys = {KEY_ID: SECRET, READER_ID: READER_SECRET, LISTER_ID: LISTER_SECRET}
    with SignatureCheckingFront(
        s3_server.port, keys, readers=frozenset({READER_ID}), read_only=frozenset({LISTER_ID})
    ) as checking:
        yield checking


@dataclass(frozen=True)
class Failure:
    """One way the store fails: the environment that makes it, the bucket asked for, and what the error must say."""

    name: str
    bucket: str
    env: dict[str, str]
    kind: str
    says: tuple[str, ...]
    """Parts of the error besides the URL and the kind: the endpoint, the variable to check."""


def failures(front: SignatureCheckingFront, bucket: str) -> dict[str, Failure]:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens: refused at once
    at = front.endpoint_url
    return {
        "wrong secret": Failure(
            "wrong secret",
            bucket,
            {"AWS_ENDPOINT_URL": at, "AWS_SECRET_ACCESS_KEY": WRONG_SECRET},
            "credentials refused",
            (at, "SignatureDoesNotMatch", f"'{KEY_ID}'", "AWS_SECRET_ACCESS_KEY"),
        ),
        "unknown key": Failure(
            "unknown key",
            bucket,
            {"AWS_ENDPOINT_URL": at, "AWS_ACCESS_KEY_ID": "nobody-knows-me"},
            "credentials refused",
            (at, "InvalidAccessKeyId", "'nobody-knows-me'", "AWS_ACCESS_KEY_ID"),
        ),
        "no bucket": Failure(
            "no bucket",
            "no-such-bucket",
            {"AWS_ENDPOINT_URL": at},
            "no such bucket",
            (at, "'no-such-bucket'", "AWS_ENDPOINT_URL"),
        ),
        "unreachable": Failure(
            "unreachable",
            bucket,
            {"AWS_ENDPOINT_URL": dead},
            "endpoint unreachable",
            (dead, "PRECURSOR_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"),
        ),
    }


FAILURES = ["wrong secret", "unknown key", "no bucket", "unreachable"]


@pytest.fixture
def failing(
    request: pytest.FixtureRequest,
    s3_env: ObjectStoreSettings,
    s3_server: LocalS3,
    front: SignatureCheckingFront,
    monkeypatch: pytest.MonkeyPatch,
) -> Failure:
    """The environment of a pipeline worker whose store fails as the test's parameter says (the session server's
    settings, with the one thing that is wrong)."""
    failure = failures(front, s3_server.bucket)[request.param]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore would retry a dead endpoint for seconds
    for name, value in failure.env.items():
        monkeypatch.setenv(name, value)
    return failure


def assert_one_clear_line(output: str, url: str, failure: Failure) -> None:
    """The output is the error line only: it names the URL, the kind and the rest, and holds no secret."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert f"{url}: {failure.kind}: " in lines[0], output
    for part in failure.says:
        assert part in lines[0], (part, output)
    assert not any(secret in output for secret in (SECRET, WRONG_SECRET, READER_SECRET, LISTER_SECRET))


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert not isinstance(result.exception, AssertionError | TypeError | AttributeError), result.exception
    return result.exit_code, result.output


# --- the error itself ------------------------------------------------------------------------------------------------


def test_the_error_keeps_its_kind_through_a_copy_and_a_missing_key_is_left_to_the_caller() -> None:
    err = ObjectStoreAccessError("s3://b/p: no such bucket: ...", "no such bucket")
    copied = pickle.loads(pickle.dumps(err))
    assert (str(copied), copied.kind) == (str(err), err.kind)
    # how Beam annotates what a step raised: the same type, the message extended
    annotated = type(err)(err.args[0] + " [while running 'WriteDays']", *err.args[1:])
    assert annotated.kind == "no such bucket" and str(annotated).endswith("[while running 'WriteDays']")
    assert explain(FileNotFoundError("s3://b/p/model.onnx"), "s3://b/p") is None


def test_an_endpoint_that_refuses_every_connection_is_reported_within_two_seconds_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """botocore's own retry default (legacy mode, 5 attempts) took 9.7 s here before the error reached anyone."""
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "PRECURSOR_S3_MAX_ATTEMPTS", "PRECURSOR_S3_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings = ObjectStoreSettings(endpoint_url=dead, access_key_id=KEY_ID, secret_access_key=SECRET)
    assert (settings.retry_mode, settings.max_attempts) == ("standard", 3)
    started = time.monotonic()
    with pytest.raises(ObjectStoreAccessError) as raised:
        filesystem(f"s3://unreachable-{uuid.uuid4().hex[:8]}/x", settings)
    assert raised.value.kind == "endpoint unreachable" and dead in str(raised.value)
    assert time.monotonic() - started < 5.0


# --- the CLI ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    history = FleetHistory(machines=2, hours=30, failures=[("pump-00", 20.5, "failure:bearing")])
    return store_history(tmp_path_factory.mktemp("store") / "store.duckdb", history.messages(steady))


@pytest.mark.integration
@pytest.mark.parametrize("failing", FAILURES, indirect=True)
def test_pipeline_label_and_monitor_end_with_one_line_naming_the_dataset_and_what_failed(
    failing: Failure, store: Path, s3_prefix: str
) -> None:
    dataset = f"s3://{failing.bucket}/{s3_prefix.rsplit('/', 1)[-1]}/labeled"
    for command in ("label", "monitor"):
        code, output = invoke("pipeline", command, "--store", str(store), "--dataset", dataset)
        assert code == 2, output
        assert_one_clear_line(output, dataset, failing)


@pytest.mark.integration
@pytest.mark.parametrize("failing", FAILURES, indirect=True)
@pytest.mark.parametrize("on_s3", ["labeled_dataset", "registry"])
def test_flows_run_retrain_ends_with_one_line_before_any_run_starts(
    failing: Failure, on_s3: str, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{failing.bucket}/{s3_prefix.rsplit('/', 1)[-1]}/{on_s3}"
    for name, value in {**OFFLINE_ENVIRONMENT, "PREFECT_HOME": str(tmp_path / "prefect")}.items():
        monkeypatch.setenv(name, value)  # what the command would set for itself, put back after the test
    monkeypatch.setenv("PRECURSOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(f"PRECURSOR_RETRAIN_{on_s3.upper()}", url)
    code, output = invoke("flows", "run", "retrain")
    assert code == 1, output
    assert_one_clear_line(output, url, failing)
    assert not (tmp_path / "state" / "flows" / "retrain").exists()  # no run began: nothing trained for minutes first


# --- the registry and the retrain's reader, as the flows call them ---------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("failing", FAILURES, indirect=True)
def test_the_registry_the_dataset_reader_and_the_ingests_release_list_raise_the_same_error(
    failing: Failure, s3_prefix: str, tmp_path: Path
) -> None:
    """A missing bucket is an error here, not an empty registry or dataset (s3fs calls it FileNotFoundError)."""
    base = f"s3://{failing.bucket}/{s3_prefix.rsplit('/', 1)[-1]}"
    keys = generate_keypair(tmp_path / "keys")
    with pytest.raises(ObjectStoreAccessError) as registry:
        open_registry(f"{base}/registry", load_public_keys(keys.public_key_path), cache_dir=tmp_path / "cache")
    with pytest.raises(ObjectStoreAccessError) as reader:
        field_labels(f"{base}/labeled")
    with pytest.raises(ObjectStoreAccessError) as ingest:  # which releases a heartbeat's model may be (pipeline run)
        release_hashes(f"{base}/registry")
    for raised, url in (
        (registry.value, f"{base}/registry"),
        (reader.value, f"{base}/labeled"),
        (ingest.value, f"{base}/registry"),
    ):
        assert raised.kind == failing.kind and str(raised).startswith(f"{url}: {failing.kind}: ")
        assert all(part in str(raised) for part in failing.says), str(raised)
        assert not any(secret in str(raised) for secret in (SECRET, WRONG_SECRET, READER_SECRET))


@pytest.mark.integration
def test_a_key_that_may_list_but_not_write_ends_label_and_publish_with_one_line_naming_the_url(
    store: Path,
    s3_env: ObjectStoreSettings,
    s3_server: LocalS3,
    front: SignatureCheckingFront,
    s3_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first listing passes for such a key, so only the first write meets the denial, inside a Beam step or the
    registry's upload: s3fs raises a bare PermissionError there that names no URL."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LISTER_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LISTER_SECRET)
    denied = Failure(
        "read-only key",
        s3_server.bucket,
        {},
        "access denied",
        (front.endpoint_url, f"access key id '{LISTER_ID}'", "(AccessDenied)", "bucket's policy"),
    )
    base = f"s3://{s3_server.bucket}/{s3_prefix.rsplit('/', 1)[-1]}"
    dataset = f"{base}/labeled-read-only"
    # The real command in a process of its own: what a user sees, Beam's own logging included.
    done = subprocess.run(
        [sys.executable, "-m", "precursor", "pipeline", "label", "--store", str(store), "--dataset", dataset],
        capture_output=True, text=True, timeout=300, env={**os.environ, "AWS_MAX_ATTEMPTS": "1"},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert_one_clear_line(done.stdout + done.stderr, dataset, denied)

    keys = generate_keypair(tmp_path / "keys", "release")
    artifact = build_artifact(tmp_path, "0.3.0", keys.private_key_path, SENSORS)
    registry = open_registry(
        f"{base}/registry-read-only", load_public_keys(keys.public_key_path), cache_dir=tmp_path / "cache"
    )
    with pytest.raises(ObjectStoreAccessError) as raised:
        registry.publish(artifact)
    assert raised.value.kind == "access denied"
    assert str(raised.value).startswith(f"{base}/registry-read-only: access denied: "), str(raised.value)
    assert all(part in str(raised.value) for part in denied.says), str(raised.value)
    assert LISTER_SECRET not in str(raised.value)
    assert registry.list() == []  # nothing half-published


# --- the edge --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, s3_server: LocalS3) -> tuple[Path, Path, str]:
    """(keys folder, artifact, its prefix in the session bucket): a signed model uploaded with the right settings,
    as a registry version (its files under the prefix) and packed (``<prefix>.tar.gz``)."""
    root = tmp_path_factory.mktemp("edge-artifact")
    generate_keypair(root / "keys", "release")
    artifact = build_artifact(root, "0.2.0", root / "keys" / "release.key", SENSORS)
    prefix = f"t-{uuid.uuid4().hex[:10]}/models/0.2.0"
    fs, _ = filesystem(f"s3://{s3_server.bucket}/{prefix}", s3_server.settings())
    fs.put(str(artifact), f"{s3_server.bucket}/{prefix}", recursive=True)
    fs.put_file(str(pack(artifact, root / "packed.tar.gz")), f"{s3_server.bucket}/{prefix}.tar.gz")
    return root / "keys", artifact, prefix


def edge_updater(keys: Path, state_dir: Path) -> ModelUpdater:
    """An edge running the drift baseline, with the object store settings of its environment."""
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-s3",
            "sources": [{"type": "tail", "path": "t.csv"}],
            "model": {"trusted_keys": [str(keys / "release.pub")]},
            "state_dir": str(state_dir),
        }
    )
    slot = ScorerSlot(RunningModel(DriftZScore()), state_file=config.state_dir / "models" / "current.json")
    return ModelUpdater(config, slot, lambda: training_windows(SENSORS)[:4])


def signed_release(keys: Path, artifact: Path, url: str) -> ModelRelease:
    return ReleaseSigner(load_private_key(keys / "release.key"))(release_for(artifact, artifact_uri=url))


@pytest.mark.integration
@pytest.mark.parametrize("failing", FAILURES, indirect=True)
def test_an_edge_keeps_its_model_logs_why_and_takes_the_release_once_the_store_answers(
    failing: Failure,
    published: tuple[Path, Path, str],
    front: SignatureCheckingFront,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore and s3fs say the most at DEBUG: no secret in it either
    keys, artifact, prefix = published
    url = f"s3://{failing.bucket}/{prefix}"
    updater = edge_updater(keys, tmp_path / "edge")
    slot = updater.slot
    release = signed_release(keys, artifact, url)

    refused = updater.apply(release)

    assert not refused.applied and refused.retry  # not remembered as bad: tried again with the next record
    assert refused.reason.startswith(f"cannot fetch the artifact: {url}: {failing.kind}: "), refused.reason
    assert all(part in refused.reason for part in failing.says), refused.reason
    assert slot.running.scorer.name == "drift-zscore"
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model update refused")]
    assert line == f"model update refused, {slot.running.label} keeps serving: {refused.reason}"
    assert not any(secret in caplog.text for secret in (SECRET, WRONG_SECRET, READER_SECRET))

    if failing.bucket == "no-such-bucket":
        return  # the release names a bucket that is not there: nothing on this edge can fix that
    # The store answers again with the right settings: the same release applies, read afresh from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    applied = updater.apply(release)
    assert applied.applied, applied.reason
    assert slot.running.scorer.version == "0.2.0"


@pytest.mark.integration
def test_a_key_that_may_not_list_fetches_a_packed_release_and_is_told_why_a_registry_version_is_refused(
    published: tuple[Path, Path, str],
    s3_env: ObjectStoreSettings,
    s3_server: LocalS3,
    front: SignatureCheckingFront,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reaching the store lists the prefix once; a listing the bucket's policy denies does not stop a fetch that
    needs none (one packed object), and one that needs it is refused naming the key and the denial."""
    keys, artifact, prefix = published
    monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET)
    packed = f"s3://{s3_server.bucket}/{prefix}.tar.gz"
    applied = edge_updater(keys, tmp_path / "packed").apply(signed_release(keys, artifact, packed))
    assert applied.applied, applied.reason

    version = f"s3://{s3_server.bucket}/{prefix}"
    refused = edge_updater(keys, tmp_path / "version").apply(signed_release(keys, artifact, version))
    assert not refused.applied and refused.retry
    assert refused.reason.startswith(f"cannot fetch the artifact: {version}: access denied: "), refused.reason
    assert f"access key id '{READER_ID}'" in refused.reason and "(AccessDenied)" in refused.reason
    assert READER_SECRET not in refused.reason
