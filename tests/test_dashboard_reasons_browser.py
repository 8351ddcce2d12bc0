"""The machine page in headless Chromium says in words why each of its alerts was raised: the reasons the edge sent
with the prediction that raised it, as the API serves them. A screenshot is kept as a test artifact."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import AUTH, TOKEN, fill_store, serving
from tests.fixtures_browser import (
    browser,  # noqa: F401 (a fixture)
    open_fleet_page,
    open_machine_history,
    read,
    screenshot,
)

pytestmark = pytest.mark.integration


def test_the_machine_page_says_why_each_alert_was_raised(browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    sim = fill_store(tmp_path / "store.duckdb", machines=8, days=6, seed=5)
    explained = [p for p in sim.predictions if p.reasons]
    assert explained
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path), KafkaSettings())
    with serving(app) as base, httpx.Client(base_url=base, headers=AUTH, timeout=20) as api:
        raised = [a for a in api.get("/api/v1/alerts", params={"state": "raised", "limit": 1000}).json()["items"]]
        machine = max({a["machine_id"] for a in raised}, key=lambda m: sum(a["machine_id"] == m for a in raised))
        mine = sorted((a for a in raised if a["machine_id"] == machine), key=lambda a: a["at"], reverse=True)[:8]
        assert any(a["reasons"] for a in mine)
        latest = api.get(f"/api/v1/machines/{machine}").json()["latest"]

        open_fleet_page(browser, base)
        open_machine_history(browser, base, machine)
        shown = read(browser, "#alert-reasons li", "data-at", "data-kind")
        assert [(at, kind) for at, kind in shown] == [(a["at"], a["kind"]) for a in mine]
        rows = browser.find_elements(By.CSS_SELECTOR, "#alert-reasons li")
        for row, alert in zip(rows, mine, strict=True):
            words = [r.text for r in row.find_elements(By.CSS_SELECTOR, ".reason")]
            assert words == [r["text"] for r in alert["reasons"] or []]
            if not alert["reasons"]:
                assert "no reasons" in row.text
        assert any("level high" in row.text for row in rows)  # the words an edge's explanation uses
        if latest["reasons"]:
            now = browser.find_element(By.ID, "latest-reasons")
            assert [r.text for r in now.find_elements(By.CSS_SELECTOR, ".reason")] == [
                r["text"] for r in latest["reasons"]
            ]
        screenshot(browser, "dashboard-machine-reasons.png")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/machines/" in e["message"]]
        assert errors == []
