"""Reasons from the edge to the API: ingest stores them, the store serves them with the prediction and with the
alert it decided, and a store written before predictions carried them still answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pytest
from fastapi.testclient import TestClient

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.store import connect
from tests.fixtures_api import AUTH, NO_BROKER, TOKEN, SimulatedStore, fill_store
from tests.test_query_cli import run

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]


@pytest.fixture(scope="module")
def sim(new_store: NewStore) -> SimulatedStore:
    return fill_store(new_store("reasons"), machines=6, days=4.0)


@pytest.fixture(scope="module")
def client(sim: SimulatedStore) -> Iterator[TestClient]:
    with TestClient(create_app(ApiSettings(tokens=TOKEN, store=sim.path), NO_BROKER)) as c:
        yield c


def get(client: TestClient, path: str, **params: object) -> dict | list:
    response = client.get(f"/api/v1{path}", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def sent(reasons: object) -> list[dict] | None:
    """Reasons as the edge sent them, in the API's JSON (unset detail fields as null)."""
    if reasons is None:
        return None
    out = []
    for r in reasons:  # type: ignore[attr-defined]
        shown = r.model_dump(mode="json")
        out.append(shown)
    return out


def test_each_prediction_keeps_the_reasons_it_came_with(client: TestClient, sim: SimulatedStore) -> None:
    explained = [p for p in sim.predictions if p.reasons]
    assert explained and len(explained) < len(sim.predictions)  # alerting windows only
    machine = explained[0].machine_id
    page = get(client, f"/machines/{machine}/predictions", limit=1000)
    by_seq = {(row["edge_id"], row["seq"]): row for row in page["items"]}  # type: ignore[index]
    for p in sim.of(machine):
        assert by_seq[(p.edge_id, p.seq)]["reasons"] == sent(p.reasons)


def test_an_alert_carries_the_reasons_of_the_prediction_that_raised_it(client: TestClient, sim: SimulatedStore) -> None:
    raised = get(client, "/alerts", state="raised", limit=1000)["items"]  # type: ignore[index]
    assert raised
    decided_by = {
        (p.machine_id, p.window_end.isoformat().replace("+00:00", "Z"), p.model_version): p for p in sim.predictions
    }
    for alert in raised:
        prediction = decided_by[(alert["machine_id"], alert["at"].replace("+00:00", "Z"), alert["model_version"])]
        assert alert["reasons"] == sent(prediction.reasons)
    assert any(alert["reasons"] for alert in raised)
    timeline = get(client, f"/machines/{raised[0]['machine_id']}/timeline")
    assert [a["reasons"] for a in timeline["alerts"] if a["state"] == "raised"]  # type: ignore[index]


def test_the_latest_prediction_of_a_machine_shows_its_reasons(client: TestClient, sim: SimulatedStore) -> None:
    for machine, p in sim.latest().items():
        assert get(client, f"/machines/{machine}")["latest"]["reasons"] == sent(p.reasons)  # type: ignore[index]


def test_a_store_from_before_reasons_answers_without_them(
    sim: SimulatedStore, new_store: NewStore, tmp_path: Path
) -> None:
    if isinstance(sim.path, Path):
        old: Path | str = tmp_path / "old.duckdb"
        con = duckdb.connect(str(old))  # not through the store's connect(), which would add the column
        con.execute(f"ATTACH '{sim.path}' AS new (READ_ONLY)")
        con.execute("CREATE TABLE predictions AS SELECT * EXCLUDE (reasons) FROM new.predictions")
        con.execute("CREATE TABLE alerts AS SELECT * FROM new.alerts")
        con.execute("CREATE TABLE events AS SELECT * FROM new.events")
        con.close()
    else:
        old = new_store("old")
        sim = fill_store(old, machines=2, days=2.0)
        with connect(old) as pg:  # this process made its tables already: the column is not added back
            pg.execute("ALTER TABLE predictions DROP COLUMN reasons")
    with TestClient(create_app(ApiSettings(tokens=TOKEN, store=old), NO_BROKER)) as c:
        machine = sim.predictions[0].machine_id
        assert all(row["reasons"] is None for row in get(c, f"/machines/{machine}/predictions")["items"])  # type: ignore[index]
        assert all(a["reasons"] is None for a in get(c, "/alerts")["items"])  # type: ignore[index]


def test_the_alerts_table_says_the_reasons_in_words(sim: SimulatedStore) -> None:
    code, table, _ = run(sim, "alerts", "--state", "raised", "-n", "1000")
    assert code == 0
    explained = [p for p in sim.predictions if p.reasons]
    assert any(p.reasons[0].text in table for p in explained)  # type: ignore[index]
    code, out, _ = run(sim, "alerts", "--state", "raised", "-n", "1000", "--json")
    assert code == 0 and any(a["reasons"] and a["reasons"][0]["kind"] == "sensor" for a in json.loads(out))
