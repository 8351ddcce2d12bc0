"""One operating point from training to the page: through the real broker, the pipeline alerts at each model's own
threshold in the run that reads the qualifying prediction, and the API's at-risk and open-alert counts agree with
the alerts table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.webdriver.common.by import By

from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.messages import Prediction
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.fixtures_api import AUTH, TOKEN, serving
from tests.fixtures_browser import (
    browser,  # noqa: F401 (a fixture)
    open_fleet_page,
    read,
    wait_for,
)
from tests.test_pipeline_alerts import consumed_alerts, produce
from tests.test_pipeline_labeling import T0

LM_THRESHOLD = 0.269  # what `precursor evaluate` reported for the demo's model

# machine -> (model name, the model's own threshold, risk per hourly window)
FLEET: dict[str, tuple[str, float | None, list[float]]] = {
    "pump-00": ("precursor-lm", LM_THRESHOLD, [0.1, 0.1, 0.3, 0.3]),  # above its threshold for its last two windows
    "pump-01": ("precursor-lm", LM_THRESHOLD, [0.3, 0.3, 0.2]),  # raised, now in the hysteresis gap: stays raised
    "pump-02": ("drift-zscore", None, [0.3, 0.3, 0.3]),  # no threshold of its own: the default 0.7
    "pump-03": ("lm-canary", LM_THRESHOLD, [0.4, 0.4, 0.4]),  # the fleet overrides this model's threshold to 0.5
    "pump-04": ("precursor-lm", LM_THRESHOLD, [0.3, 0.3, 0.1]),  # raised, then cleared below 0.269 x 0.6
}
SETTINGS = PipelineSettings(alert_model_thresholds={"lm-canary": 0.5})


def fleet_predictions() -> list[Prediction]:
    out = []
    for m, (model, threshold, risks) in FLEET.items():
        for h, risk in enumerate(risks, start=1):
            end = T0 + timedelta(hours=h)
            p = Prediction(
                edge_id=f"edge-{m}", seq=h, machine_id=m, window_start=end - timedelta(hours=6), window_end=end,
                horizon_h=24, risk={"failure": risk}, model_name=model, model_version="3", threshold=threshold,
            )  # fmt: skip
            out.append(p)
    return out


def open_in_table(store: Path) -> set[tuple[str, str]]:
    with connect(store, read_only=True) as con:
        rows = con.execute(
            """
            SELECT machine_id, kind FROM alerts
            QUALIFY row_number() OVER (PARTITION BY machine_id, kind ORDER BY ts DESC, state = 'cleared' DESC) = 1
                AND state = 'raised'
            """
        ).fetchall()
    return {(m, k) for m, k in rows}


@pytest.fixture
def ingested(tmp_path: Path, kafka_settings: KafkaSettings) -> Path:
    store = tmp_path / "store.duckdb"
    produce(kafka_settings, fleet_predictions())
    report = run_once(kafka_settings, store, pipeline_settings=SETTINGS)
    # Decided in the run that read them: the newest window completes pump-00's streak, no newer window needed.
    assert (report.read, report.alerts_raised, report.alerts_cleared) == (16, 3, 1)
    return store


def make_app(store: Path, kafka: KafkaSettings) -> FastAPI:
    app = create_app(ApiSettings(tokens=TOKEN, store=store, live_poll_ms=100), kafka)
    app.state.alert_rule = SETTINGS.alert_rule
    return app


@pytest.fixture
def api(ingested: Path, kafka_settings: KafkaSettings) -> Iterator[tuple[TestClient, Path]]:
    with TestClient(make_app(ingested, kafka_settings)) as client:
        yield client, ingested


def get(client: TestClient, path: str, **params: object) -> dict:
    response = client.get(f"/api/v1{path}", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.integration
def test_a_machine_above_its_models_threshold_gets_an_open_alert_and_the_pages_agree(
    api: tuple[TestClient, Path], kafka_settings: KafkaSettings
) -> None:
    client, store = api
    assert open_in_table(store) == {("pump-00", "failure"), ("pump-01", "failure")}
    on_kafka = consumed_alerts(kafka_settings, 4)
    assert sorted((a.machine_id, a.state, a.at - T0) for a in on_kafka) == [
        ("pump-00", "raised", timedelta(hours=4)),
        ("pump-01", "raised", timedelta(hours=2)),
        ("pump-04", "cleared", timedelta(hours=3)),
        ("pump-04", "raised", timedelta(hours=2)),
    ]

    summary = get(client, "/fleet/summary")
    rows = {r["machine_id"]: r for r in get(client, "/machines/at-risk", limit=100)["items"]}
    # Open alerts: the summary, the rows and the table say the same.
    assert summary["open_alerts"] == len(open_in_table(store)) == 2
    assert {(m, a["kind"]) for m, r in rows.items() for a in r["open_alerts"]} == open_in_table(store)
    # At risk: each machine at its operating point, counted alike by the summary and the rows.
    assert {m: (r["threshold"], r["band"]) for m, r in rows.items()} == {
        "pump-00": (LM_THRESHOLD, "high"),
        "pump-01": (LM_THRESHOLD, "elevated"),
        "pump-02": (0.7, "low"),
        "pump-03": (0.5, "elevated"),
        "pump-04": (LM_THRESHOLD, "low"),
    }
    assert summary["at_risk"] == sum(r["at_risk"] for r in rows.values()) == 1
    assert summary["threshold"] is None and summary["operating_point"]["model_thresholds"] == {"lm-canary": 0.5}
    assert datetime.fromisoformat(rows["pump-00"]["elevated_since"]) == T0 + timedelta(hours=3)
    # Every machine at risk for as many windows as an alert needs has one open, and no alert is open below the
    # clear level.
    for m, r in rows.items():
        if r["band"] == "low":
            assert not r["open_alerts"], m
    assert rows["pump-00"]["open_alerts"] and rows["pump-01"]["open_alerts"]
    # The machine page draws the machine's own operating point; a fixed threshold is still a question one may ask.
    assert get(client, "/machines/pump-00/timeline")["threshold"] == LM_THRESHOLD
    assert get(client, "/machines/pump-03/timeline")["threshold"] == 0.5
    assert get(client, "/fleet/summary", threshold=0.7)["at_risk"] == 0


@pytest.mark.integration
def test_the_dashboard_bands_and_counts_follow_each_models_operating_point_live_too(
    ingested: Path,
    kafka_settings: KafkaSettings,
    browser: webdriver.Chrome,  # noqa: F811
) -> None:

    def card(key: str) -> str:
        # Found and read in one step: the page redraws its cards as events arrive.
        return browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e === null ? '' : e.innerText.trim()",
            f'[data-card="{key}"] .value',
        )

    with serving(make_app(ingested, kafka_settings)) as base:
        open_fleet_page(browser, base)
        wait_for(
            "the live tail", lambda: browser.find_element(By.ID, "live-status").get_attribute("data-state") == "live"
        )
        assert (card("at-risk"), card("alerts")) == ("1", "2")  # as the API and the alerts table say
        bands = {m: c.split()[1] for m, c in read(browser, "#risk-map .tile", "data-machine", "class")}
        assert bands == {
            "pump-00": "high",
            "pump-01": "elevated",
            "pump-02": "low",
            "pump-03": "elevated",
            "pump-04": "low",
        }

        # pump-04's model (threshold 0.269) sends 0.3 live: the page judges it at that threshold, not at a fixed one.
        end = T0 + timedelta(hours=4)
        fresh = Prediction(
            edge_id="edge-pump-04", seq=4, machine_id="pump-04", window_start=end - timedelta(hours=6), window_end=end,
            horizon_h=24, risk={"failure": 0.3}, model_name="precursor-lm", model_version="3", threshold=LM_THRESHOLD,
        )  # fmt: skip
        produce(kafka_settings, [fresh])
        wait_for("pump-04 at risk", lambda: card("at-risk") == "2")
        tiles = dict(read(browser, "#risk-map .tile", "data-machine", "class"))
        assert "high" in tiles["pump-04"].split()
