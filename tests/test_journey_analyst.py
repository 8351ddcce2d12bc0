"""The analyst's journey, as the README tells it: one prediction store, and the same three questions (which machines
are at risk, one machine's history, which alerts are open) asked three ways: `precursor query … --json`, the HTTP
API of `precursor serve` (run as its console script, with a token), and the dashboard in headless Chromium. The
three must agree: the same machines, in the same order, with the same risks as the dashboard rounds them.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from infra.processes import free_ports
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import AUTH, TOKEN, SimulatedStore, fill_store
from tests.fixtures_browser import browser, wait_for  # noqa: F401  (browser is a fixture)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = REPO_ROOT / ".venv" / "bin"


def shown(risk: float | None) -> str:
    """A risk as the dashboard writes it: a whole percent, halves rounded up (JavaScript's Math.round)."""
    return "–" if risk is None else f"{math.floor(risk * 100 + 0.5)}%"


def lead(hours: float | None) -> str:
    return "missed" if hours is None else f"{hours:.1f} h"


def at(stamp: str) -> datetime:
    """The CLI writes UTC as +00:00 and the API as Z: the same instant."""
    return datetime.fromisoformat(stamp)


def query(store: Path, *args: str) -> object:
    done = subprocess.run(
        [BIN / "precursor", "query", *args, "--store", store, "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedStore:
    return fill_store(tmp_path / "store.duckdb", machines=12, days=6, seed=5)


@pytest.fixture
def served(sim: SimulatedStore, kafka_settings: KafkaSettings, tmp_path: Path) -> Iterator[str]:
    """`precursor serve` on a free port, its token from PRECURSOR_API_TOKENS, until the test ends."""
    (port,) = free_ports(1)
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PRECURSOR_STATE_DIR": str(tmp_path / "state"),
        "PRECURSOR_API_TOKENS": TOKEN,
        "PRECURSOR_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "PRECURSOR_KAFKA_TOPIC_PREFIX": kafka_settings.topic_prefix,
    }
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [BIN / "precursor", "serve", "--store", sim.path, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(f"{base}/api/v1/fleet/summary", headers=AUTH, timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "precursor serve did not answer within 30 s"
        time.sleep(0.2)
    try:
        yield base
    finally:
        server.terminate()
        server.wait(20)
        log.close()


def test_query_api_and_dashboard_give_an_analyst_the_same_answers(
    sim: SimulatedStore,
    served: str,
    browser: webdriver.Chrome,  # noqa: F811
) -> None:
    api = httpx.Client(base_url=f"{served}/api/v1", headers=AUTH, timeout=20)
    assert httpx.get(f"{served}/api/v1/machines/at-risk").status_code == 401  # no token, no answer

    # 1. Which machines are at risk, riskiest first.
    cli_fleet = query(sim.path, "at-risk", "--limit", "1000")
    api_fleet = api.get("/machines/at-risk", params={"limit": 1000}).json()["items"]
    browser.get(f"{served}/dashboard/#token={TOKEN}")
    wait_for("the fleet page", lambda: browser.execute_script("return document.body.dataset.ready") == "fleet")
    dashboard_fleet = [
        (m, risk)
        for m, risk in browser.execute_script(
            "return [...document.querySelectorAll('#fleet-table tbody tr')]"
            ".map(tr => [tr.dataset.machine, tr.querySelector('.riskval').textContent])"
        )
    ]
    assert len(cli_fleet) == len(sim.machines) >= 10  # type: ignore[arg-type]
    assert [(r["machine_id"], shown(r["max_risk"])) for r in cli_fleet] == dashboard_fleet  # type: ignore[union-attr,index]
    assert [(r["machine_id"], shown(r["max_risk"])) for r in api_fleet] == dashboard_fleet
    assert [r["machine_id"] for r in cli_fleet] == [r["machine_id"] for r in api_fleet]  # type: ignore[union-attr,index]
    at_risk = [r["machine_id"] for r in cli_fleet if r["at_risk"]]  # type: ignore[union-attr,index]
    card = browser.find_element(By.CSS_SELECTOR, '[data-card="at-risk"] .value').text
    assert at_risk and int(card) == len(at_risk) == api.get("/fleet/summary").json()["at_risk"]

    # 2. Which alerts are open, per machine; and the newest alerts, raised or cleared.
    def open_alerts(fleet: list[dict]) -> list[tuple[str, list[str]]]:  # type: ignore[type-arg]
        return [(r["machine_id"], sorted(a["kind"] for a in r["open_alerts"] or [])) for r in fleet]

    dashboard_open = [
        (m, sorted(kinds))
        for m, kinds in browser.execute_script(
            "return [...document.querySelectorAll('#fleet-table tbody tr')].map(tr =>"
            " [tr.dataset.machine, [...tr.cells[6].querySelectorAll('.pill')].map(p => p.textContent)])"
        )
    ]
    assert open_alerts(cli_fleet) == open_alerts(api_fleet) == dashboard_open  # type: ignore[arg-type]
    open_count = sum(len(kinds) for _, kinds in dashboard_open)
    assert open_count >= 1
    assert int(browser.find_element(By.CSS_SELECTOR, '[data-card="alerts"] .value').text) == open_count
    cli_alerts = query(sim.path, "alerts", "--limit", "8")
    api_alerts = api.get("/alerts", params={"limit": 8}).json()["items"]
    as_text = [
        f"{'▲ alert' if a['state'] == 'raised' else '▼ cleared'} {a['machine_id']} {a['kind']}" for a in api_alerts
    ]
    assert [(a["machine_id"], a["kind"], a["state"], at(a["at"])) for a in cli_alerts] == [  # type: ignore[index,union-attr]
        (a["machine_id"], a["kind"], a["state"], at(a["at"])) for a in api_alerts
    ]
    feed = browser.execute_script(
        "return [...document.querySelectorAll('#live-feed li[data-kind=alert] .what')].map(e => e.textContent)"
    )
    assert feed == as_text and len(feed) == 8

    # 3. One machine's history: the one with the most failures, some foreseen, maybe one missed.
    machine = max(sim.machines, key=lambda m: (sum(f.machine_id == m for f in sim.failures()), m))
    cli_machine = query(sim.path, "machine", machine, "--limit", "1000")
    api_failures = api.get(f"/machines/{machine}/failures", params={"limit": 1000}).json()["items"]
    api_summary = api.get(f"/machines/{machine}").json()
    browser.get(f"{served}/dashboard/#/machine/{machine}")
    wait_for("the machine page", lambda: browser.execute_script("return document.body.dataset.ready") == "machine")
    wait_for("its title", lambda: browser.find_element(By.ID, "machine-title").text == machine)
    dashboard_failures = [tuple(r) for r in read_cells(browser, "#failures-table tbody tr")]

    def failure_rows(failures: list[dict]) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
        return [(f["failure_kind"], lead(f["lead_time_h"]), shown(f["peak_risk"])) for f in failures]

    cli_failures = cli_machine["failures"]  # type: ignore[index,call-overload]
    assert len(cli_failures) >= 2
    assert failure_rows(cli_failures) == failure_rows(api_failures) == [r[1:] for r in dashboard_failures]
    assert [at(f["failed_at"]) for f in cli_failures] == [at(f["failed_at"]) for f in api_failures]
    latest = cli_machine["machine"]["latest"]  # type: ignore[index,call-overload]
    assert shown(latest["max_risk"]) == shown(api_summary["latest"]["max_risk"])
    assert browser.find_element(By.ID, "machine-risk").text == shown(latest["max_risk"])
    assert browser.find_element(By.ID, "machine-model").text == latest["model_version"]
    api_predictions = api.get(f"/machines/{machine}/predictions", params={"limit": 1000}).json()["items"]
    cli_predictions = cli_machine["predictions"]  # type: ignore[index,call-overload]
    assert len(cli_predictions) == len(sim.of(machine)) == len(api_predictions)
    assert [(at(p["window_end"]), shown(p["max_risk"])) for p in cli_predictions] == [
        (at(p["window_end"]), shown(p["max_risk"])) for p in api_predictions
    ]
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def read_cells(driver: webdriver.Chrome, selector: str) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(tr => [...tr.cells].map(c => c.textContent.trim()))",
        selector,
    )
