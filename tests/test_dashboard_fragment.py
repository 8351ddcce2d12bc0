"""The dashboard's URL fragment in headless Chromium: a sign-in link's ``token=`` is taken out whole, wherever it is.

The reproduction: ``#/machine/plant-a-013&token=…`` left the route ``#/machine/plant-a-013&``, and the machine page
asked the API for ``plant-a-013&``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import TOKEN, fill_store, serving
from tests.fixtures_browser import browser, wait_for

pytestmark = pytest.mark.integration

__all__ = ["browser"]  # the fixture, shared with the dashboard's browser test

CASES = [
    ("#/machine/plant-a-013&token=abc", "abc", "#/machine/plant-a-013"),
    ("#token=abc&/machine/plant-a-013", "abc", "#/machine/plant-a-013"),
    ("#token=abc", "abc", "#/"),
    ("#/models&token=x%2By&", "x+y", "#/models"),
    ("#/machine/a%26b&token=abc", "abc", "#/machine/a%26b"),
    ("#/machine/plant-a-013", None, "#/machine/plant-a-013"),
    ("#/machine/plant-a-013&token=", None, "#/machine/plant-a-013&token="),
]


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    sim = fill_store(tmp_path / "store.duckdb", machines=3, days=1, seed=3, with_alerts=False)
    # No broker: the live tail just reports itself offline, and no developer's broker is touched.
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path), KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    with serving(app) as base:
        yield base, sim.machines


def test_the_token_is_taken_out_of_the_fragment_wherever_it_is(
    browser: webdriver.Chrome, dashboard: tuple[str, list[str]]
) -> None:
    base, _ = dashboard
    browser.get(f"{base}/dashboard/")
    taken = browser.execute_async_script(
        "const [cases, done] = arguments;"
        "import('./fragment.js').then((m) => done(cases.map((hash) => m.takeToken(hash))));",
        [hash for hash, _, _ in CASES],
    )
    assert [(t["token"], t["rest"]) for t in taken] == [(token, rest) for _, token, rest in CASES]


def test_a_sign_in_link_to_a_machine_opens_that_machine(
    browser: webdriver.Chrome, dashboard: tuple[str, list[str]]
) -> None:
    base, machines = dashboard
    machine = machines[0]
    browser.get(f"{base}/dashboard/#/machine/{machine}&token={TOKEN}")
    wait_for("the machine page", lambda: browser.execute_script("return document.body.dataset.ready") == "machine")
    assert browser.execute_script("return location.hash") == f"#/machine/{machine}"
    assert browser.execute_script("return sessionStorage.getItem('precursor.token')") == TOKEN
    assert machine in browser.find_element("tag name", "main").text
