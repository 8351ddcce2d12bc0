"""The dashboard in headless Chromium against a store filled by the simulator and the real broker: it shows the same
machines at risk as the API, a new prediction arrives live, and screenshots are kept as test artifacts (the browser
and its helpers: tests/fixtures_browser.py).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from kafka import KafkaProducer
from selenium import webdriver
from selenium.webdriver.common.by import By

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.messages import Prediction, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import PredictionStore, connect
from tests.fixtures_api import AUTH, TOKEN, SimulatedStore, fill_store, serving
from tests.fixtures_browser import (
    browser,  # noqa: F401 (a fixture)
    open_fleet_page,
    open_machine_history,
    read,
    screenshot,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedStore:
    return fill_store(tmp_path / "store.duckdb", machines=12, days=6, seed=5)


def flag_edges(sim: SimulatedStore) -> None:
    """A forged heartbeat in edge-a's name, and edge-b reporting a model the registry does not hold."""
    newest = max((h for h in sim.heartbeats if h.edge_id == "edge-a"), key=lambda h: h.timestamp)
    forged = newest.model_dump(include={"edge_id", "seq", "model_name", "outbox_depth", "lag_s", "health", "machines"})
    forged |= {"ts": newest.timestamp, "ingested_at": newest.timestamp, "model_version": "9.9.9", "trust": "forged"}
    PredictionStore(sim.path).insert_table("heartbeats", pa.Table.from_pylist([forged]))
    with connect(sim.path) as con:
        con.execute("UPDATE heartbeats SET model_known = false WHERE edge_id = 'edge-b'")


def table_rows(driver: webdriver.Chrome) -> list[tuple[str, float]]:
    return [(m, float(r)) for m, r in read(driver, "#fleet-table tbody tr", "data-machine", "data-risk")]


def test_the_dashboard_matches_the_api_and_updates_live(
    browser: webdriver.Chrome,  # noqa: F811 (the fixture)
    sim: SimulatedStore,
    kafka_settings: KafkaSettings,
) -> None:
    flag_edges(sim)
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path, live_poll_ms=100), kafka_settings)
    with serving(app) as base, httpx.Client(base_url=base, headers=AUTH, timeout=20) as api:
        open_fleet_page(browser, base)
        assert "token=" not in browser.current_url  # taken out of the address bar at once
        wait_for(
            "the live tail",
            lambda: browser.find_element(By.ID, "live-status").get_attribute("data-state") == "live",
        )

        # The machines shown, their order and their risk are the API's answer.
        answer = api.get("/api/v1/machines/at-risk", params={"limit": 1000}).json()
        shown = table_rows(browser)
        assert shown == [(m["machine_id"], m["max_risk"]) for m in answer["items"]]
        summary = api.get("/api/v1/fleet/summary").json()
        at_risk_card = browser.find_element(By.CSS_SELECTOR, '[data-card="at-risk"] .value').text
        assert int(at_risk_card) == summary["at_risk"] and summary["at_risk"] >= 1
        tiles = read(browser, "#risk-map .tile", "data-machine", "class")
        assert [m for m, _ in tiles] == [m for m, _ in shown]
        assert "critical" in tiles[0][1] or "high" in tiles[0][1]

        # A new prediction for the calmest machine arrives over Kafka and moves it to the top, live.
        calmest, _ = shown[-1]
        latest = sim.latest()[calmest]
        fresh = Prediction(
            edge_id=latest.edge_id,
            seq=10_000_000,
            machine_id=calmest,
            window_start=latest.window_start + timedelta(hours=1),
            window_end=latest.window_end + timedelta(hours=1),
            horizon_h=24,
            risk={"bearing": 0.97, "clog": 0.2},
            model_name=latest.model_name,
            model_version=latest.model_version,
        )
        producer = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
        sent = time.monotonic()
        producer.send(kafka_settings.topics.predictions, key=calmest.encode(), value=encode(fresh))
        producer.flush()
        producer.close()
        expected = sorted(
            [(m, r) for m, r in shown if m != calmest] + [(calmest, 0.97)], key=lambda mr: (-mr[1], mr[0])
        )
        wait_for("the new prediction, sorted into the table", lambda: table_rows(browser) == expected)
        arrived_s = time.monotonic() - sent
        feed = browser.execute_script(
            "return [...document.querySelectorAll('#live-feed li')].map(li => li.textContent)"
        )
        assert feed and calmest in feed[0]
        delays = browser.execute_script("return window.precursorLive.delaysMs")
        assert len(delays) >= 1
        screenshot(browser, "dashboard-fleet.png")
        assert arrived_s < 10

        # The machine page: risk with failures and lead times marked, sensor lines, the failures table.
        machine = next(m for m in sim.machines if any(f.machine_id == m for f in sim.failures()))
        open_machine_history(browser, base, machine)
        failures = api.get(f"/api/v1/machines/{machine}/failures").json()["items"]
        markers = browser.find_elements(By.CSS_SELECTOR, "#risk-chart [data-marker='failure']")
        assert len(markers) == len(failures)
        spans = browser.find_elements(By.CSS_SELECTOR, "#risk-chart [data-kind='span']")
        assert len(spans) == sum(1 for f in failures if f["lead_time_h"] is not None)
        assert len(browser.find_elements(By.CSS_SELECTOR, ".sensor svg")) == 7
        assert len(browser.find_elements(By.CSS_SELECTOR, "#failures-table tbody tr")) == len(failures)
        screenshot(browser, "dashboard-machine.png")

        # Model rollout per edge, as the API says.
        browser.get(f"{base}/dashboard/#/models")
        wait_for("the models page", lambda: browser.execute_script("return document.body.dataset.ready") == "models")
        answer = api.get("/api/v1/models/rollout").json()
        rollout = [[e["edge_id"], e["status"], " ".join(e["identity"]["flags"])] for e in answer]
        cards = read(browser, "#rollout [data-edge]", "data-edge", "data-status", "data-flags")
        assert sorted(cards) == sorted(rollout)
        assert {e["edge_id"]: e["identity"]["flags"] for e in answer} == {
            "edge-a": ["forged", "unsigned"],
            "edge-b": ["unsigned", "unknown_model"],
        }
        pills = read(browser, "#rollout [data-edge='edge-a'] [data-flag]", "data-flag")
        assert pills == [["unsigned"], ["forged"]]
        assert browser.find_element(By.CSS_SELECTOR, "#rollout [data-edge='edge-a'] [data-flag='forged']").text == (
            "forged × 1"
        )
        screenshot(browser, "dashboard-models.png")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors


def test_the_models_page_shows_each_versions_calibration(
    browser: webdriver.Chrome,  # noqa: F811 (the fixture)
    sim: SimulatedStore,
    tmp_path: Path,
) -> None:
    from tests.test_api_calibration import write_registry

    registry = write_registry(tmp_path)
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path, model_registry=registry), KafkaSettings())
    with serving(app) as base, httpx.Client(base_url=base, headers=AUTH, timeout=20) as api:
        open_fleet_page(browser, base)
        browser.get(f"{base}/dashboard/#/models")
        wait_for("the models page", lambda: browser.execute_script("return document.body.dataset.ready") == "models")
        answer = api.get("/api/v1/models/calibration").json()
        rows = read(
            browser, "#calibration-table tr[data-version]", "data-version", "data-method", "data-identity", "data-error"
        )
        assert rows == [
            ["0.1.0", "identity", "true", None],
            ["0.2.0", "platt", "false", None],
            ["0.3.0", None, None, "true"],
        ]
        assert [r[0] for r in rows] == [v["version"] for v in answer]
        platt = browser.find_element(By.CSS_SELECTOR, '#calibration-table tr[data-version="0.2.0"]')
        assert platt.find_element(By.CSS_SELECTOR, '[data-field="ece"]').text == "0.210 → 0.030"
        assert platt.find_element(By.CSS_SELECTOR, '[data-field="brier"]').text == "0.1200 → 0.0600"
        # one point per non-empty validation bin of the API's answer, drawn inline
        bins = next(v for v in answer if v["version"] == "0.2.0")["validation"]["reliability"]
        points = read(browser, '#calibration-table tr[data-version="0.2.0"] svg.reliability circle', "data-count")
        assert [int(c) for (c,) in points] == [b["count"] for b in bins if b["count"]]
        edited = browser.find_element(By.CSS_SELECTOR, '#calibration-table tr[data-version="0.3.0"]').text
        assert "signed manifest" in edited
        old = browser.find_element(By.CSS_SELECTOR, '#calibration-table tr[data-version="0.1.0"]').text
        assert "no bins recorded" in old
        screenshot(browser, "dashboard-models-calibration.png")

    # without a registry the page says which setting names one, the rest of it still renders, and nothing fails
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path), KafkaSettings())
    with serving(app) as base:
        open_fleet_page(browser, base)
        browser.get(f"{base}/dashboard/#/models")
        wait_for("the models page", lambda: browser.execute_script("return document.body.dataset.ready") == "models")
        assert "PRECURSOR_API_MODEL_REGISTRY" in browser.find_element(By.ID, "calibration-none").text
        assert browser.find_elements(By.ID, "versions-table")
        # (the fleet page's live tail has no broker here: only the calibration's own requests are judged)
        failed = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/models/" in e["message"]]
        assert failed == []


def test_the_machine_page_draws_the_sensor_lines_an_edge_sent(
    browser: webdriver.Chrome,  # noqa: F811 (the fixture)
    tmp_path: Path,
    kafka_settings: KafkaSettings,
) -> None:
    from tests.test_telemetry_summaries import summaries_through_the_spine

    store, sent = summaries_through_the_spine(tmp_path, kafka_settings)
    machine = "pump-1"
    mine = sorted((s for s in sent if s.machine_id == machine), key=lambda s: s.window_end)
    sensors = sorted({name for s in mine for name in s.sensors})
    app = create_app(ApiSettings(tokens=TOKEN, store=store), kafka_settings)
    with serving(app) as base:
        open_fleet_page(browser, base)
        open_machine_history(browser, base, machine)
        assert browser.find_elements(By.CSS_SELECTOR, "#risk-chart svg")  # the risk above, on the same time axis
        # A chart per sensor the edge summarized, each with its line and the latest reading the edge reported.
        panels = read(browser, "#sensor-charts .sensor", "data-sensor", "data-points", "data-last")
        assert [p[0] for p in panels] == sensors
        for name, points, last in panels:
            values = [s.sensors[name] for s in mine if name in s.sensors]
            assert int(points) == len(values) and float(last) == values[-1].last
            line = browser.find_elements(
                By.CSS_SELECTOR, f'.sensor[data-sensor="{name}"] svg path[data-series="{name}"]'
            )
            assert len(line) == 1
        screenshot(browser, "dashboard-machine-sensors.png")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/machines/" in e["message"]]
        assert errors == []
