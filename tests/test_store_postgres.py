"""The store on PostgreSQL: the ingest pipeline writes it from the real broker exactly once, alone, on a rerun and
beside another run writing the same database; the password never shows; ``precursor store`` runs a server."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.parquet as pq
import pytest
from kafka import KafkaProducer
from typer.testing import CliRunner

from infra.postgres_server import LocalPostgres
from pipelines.flow import observe
from pipelines.labeling import read_dataset, run_labeling
from pipelines.run import CONSUMER, RunReport, run_once
from pipelines.snapshot import take_snapshot
from precursor.contracts.messages import encode
from precursor.contracts.settings import KafkaSettings, PrecursorSettings
from precursor.store import PredictionStore, StoreBusy, connect
from precursor.store.queries import reading
from tests.fixtures_api import simulated_fleet_messages
from tests.fixtures_store import store_messages

pytest_plugins = ["tests.fixtures_postgres"]


@pytest.fixture(scope="module")
def fleet() -> tuple[list, list]:
    _, predictions, events, _ = simulated_fleet_messages(machines=4, days=1.5)
    return predictions, events


def produce(settings: KafkaSettings, predictions: list, events: list) -> None:
    producer = KafkaProducer(**settings.client_kwargs(), acks="all")
    for p in [*predictions, *predictions[:25]]:  # the first 25 sent twice, as an edge retries
        producer.send(settings.topics.predictions, key=p.machine_id.encode(), value=encode(p))
    for e in events:
        producer.send(settings.topics.events, key=e.machine_id.encode(), value=encode(e))
    producer.flush()
    producer.close()


def fresh_database(server: LocalPostgres, name: str) -> str:
    return server.create_database(f"{name}_{uuid.uuid4().hex[:10]}")


def stored(url: str) -> dict[str, object]:
    with reading(url) as store:
        keys = store.rows("SELECT count(*) AS n, count(DISTINCT (edge_id, seq)) AS keys FROM predictions")[0]
        latest = store.rows("SELECT count(*) AS n FROM latest_predictions")[0]["n"]
        events = store.rows("SELECT count(*) AS n FROM events")[0]["n"]
    return {"predictions": keys["n"], "keys": keys["keys"], "latest": latest, "events": events}


@pytest.mark.integration
def test_ingest_writes_postgres_exactly_once_alone_on_a_rerun_and_beside_another_run(
    kafka_settings: KafkaSettings, postgres_server: LocalPostgres, fleet: tuple[list, list]
) -> None:
    predictions, events = fleet
    produce(kafka_settings, predictions, events)
    machines = len({p.machine_id for p in predictions})
    url = fresh_database(postgres_server, "ingest")

    first = run_once(kafka_settings, url)
    assert (first.read, first.stored) == (len(predictions) + 25 + len(events), len(predictions) + len(events))
    want = {"predictions": len(predictions), "keys": len(predictions), "latest": machines, "events": len(events)}
    assert stored(url) == want
    # The offsets went in with the rows: the next run finds nothing new.
    assert PredictionStore(url).offsets(CONSUMER, kafka_settings.topics.predictions)
    assert run_once(kafka_settings, url).read == 0
    # Everything read again from the start is found stored, none of it twice.
    again = run_once(kafka_settings, url, from_beginning=True)
    assert (again.stored, again.already_stored) == (0, len(predictions) + len(events))
    assert stored(url) == want
    # The flow view reads the runs, rows and positions that ingest kept in the same store.
    seen = observe(kafka_settings, url)
    assert not [p for p in seen.problems if p.startswith("store")], seen.problems
    assert [r["read"] for r in seen.runs] == [first.read, again.read]
    assert seen.rows["predictions"] == len(predictions) and seen.last_run_at is not None

    # Two runs at once into one new database, over the same records (as two consumers of the same partitions).
    shared = fresh_database(postgres_server, "shared")
    reports: dict[str, RunReport] = {}
    failures: list[BaseException] = []

    def run(consumer: str) -> None:
        try:
            reports[consumer] = run_once(kafka_settings, shared, consumer=consumer, from_beginning=True)
        except BaseException as err:  # reported by the test thread below
            failures.append(err)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("ingest-a", "ingest-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    assert stored(shared) == want
    # Each row was new to exactly one of them.
    assert sum(r.stored for r in reports.values()) == len(predictions) + len(events)
    assert sum(r.already_stored for r in reports.values()) == len(predictions) + len(events)


@pytest.mark.integration
def test_labeling_reads_a_postgres_store_as_it_reads_a_duckdb_one(
    postgres_server: LocalPostgres, tmp_path: Path, fleet: tuple[list, list]
) -> None:
    predictions, events = fleet
    pg, duck = fresh_database(postgres_server, "labels"), tmp_path / "store.duckdb"
    for store in (pg, duck):
        store_messages(store, [*predictions, *events])
    snapshots = [take_snapshot(store, tmp_path / f"snapshot-{i}") for i, store in enumerate((pg, duck))]
    for name in ("predictions", "events"):
        from_pg, from_duckdb = (pq.read_table(getattr(s, name)) for s in snapshots)
        assert from_pg.num_rows > 0 and from_pg.to_pylist() == from_duckdb.to_pylist(), name
        assert [f.type for f in from_pg.schema] == [f.type for f in from_duckdb.schema], name
    reports = [run_labeling(store, tmp_path / f"labels-{i}") for i, store in enumerate((pg, duck))]
    assert reports[0].examples > 0 and reports[0].examples == reports[1].examples
    assert read_dataset(tmp_path / "labels-0").equals(read_dataset(tmp_path / "labels-1"))


def test_the_password_is_in_no_message_repr_or_log(
    postgres_server: LocalPostgres, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = (postgres_server.pgpass.read_text().strip().rsplit(":", 1))[1]
    url = fresh_database(postgres_server, "secret")
    parts = urlsplit(url)
    with_password = urlunsplit(parts._replace(netloc=f"precursor:{password}@{parts.hostname}:{parts.port}"))
    wrong = urlunsplit(parts._replace(netloc=f"precursor:{password}x@{parts.hostname}:{parts.port}"))
    monkeypatch.delenv("PGPASSFILE")
    caplog.set_level(logging.DEBUG)
    with connect(with_password):  # the password in the URL works...
        pass
    store = PredictionStore(with_password)
    assert password not in repr(store) and "***" in repr(store)
    monkeypatch.setenv("PRECURSOR_STORE_URL", wrong)
    # ...and a wrong one is refused without being shown.
    with pytest.raises(StoreBusy) as refused, reading(PrecursorSettings().store_path, wait_s=0.5):
        pass
    assert "***" in str(refused.value) and password not in str(refused.value)
    assert password not in caplog.text


def test_store_up_status_down(monkeypatch: pytest.MonkeyPatch) -> None:
    from precursor.store_cli import store_app

    # Not under pytest's temporary folder (private to the user, one level deeper in a parallel worker): a root test
    # run starts the server as the postgres account, which must reach the folder.
    state = Path(tempfile.mkdtemp(prefix="precursor-store-cli-"))
    state.chmod(0o755)
    runner = CliRunner()
    monkeypatch.setenv("PGPASSFILE", str(state / "postgres" / "pgpass"))  # as `up` tells the user to
    try:
        up = runner.invoke(store_app, ["up", "--state-dir", str(state)])
        assert up.exit_code == 0, up.output
        url = next(line.split("=", 1)[1] for line in up.output.splitlines() if "PRECURSOR_STORE_URL=" in line)
        password = (state / "postgres" / "pgpass").read_text().strip().rsplit(":", 1)[1]
        assert password not in up.output and url.startswith("postgresql://precursor@127.0.0.1:")
        with reading(url) as store:  # up made the tables: an empty store, not a missing one
            assert store.at_risk().rows == []
        status = runner.invoke(store_app, ["status", "--state-dir", str(state), "--json"])
        assert status.exit_code == 0 and url in status.output
    finally:
        down = runner.invoke(store_app, ["down", "--state-dir", str(state)])
        stopped = runner.invoke(store_app, ["status", "--state-dir", str(state)])
        shutil.rmtree(state, ignore_errors=True)
    assert down.exit_code == 0, down.output
    assert stopped.exit_code == 1
