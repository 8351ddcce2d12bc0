"""Headless Chromium for the dashboard's browser tests: the driver fixture, waiting on a condition, reading the page
in one step, clicking through re-renders, and full-page screenshots kept as test artifacts.

Needs Debian's ``chromium`` and ``chromium-driver`` (installed by the setup script). Screenshots go to
``$PRECURSOR_TEST_ARTIFACTS`` (default ``.state/test-artifacts``).
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from tests.conftest import REPO_ROOT
from tests.fixtures_api import TOKEN

ARTIFACTS = Path(os.environ.get("PRECURSOR_TEST_ARTIFACTS", REPO_ROOT / ".state" / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05) -> Any:
    """``check()``'s first true value, asked every ``interval_s``; an AssertionError naming ``what`` past the time."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


@contextmanager
def headless_chromium(profile: Path, *, width: int = 1440, height: int = 1100) -> Iterator[webdriver.Chrome]:
    """Chromium without a screen, with its own profile folder, and quiet: no sync, updates or background traffic
    that would add requests (and delays) a measurement or a test does not ask for."""
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "the browser needs Debian's chromium and chromium-driver packages (apt-get install chromium chromium-driver)"
    )
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def open_fleet_page(driver: webdriver.Chrome, base: str) -> None:
    """The dashboard at ``base``, signed in with the test token; returns once the fleet page is drawn."""
    driver.get(f"{base}/dashboard/#token={TOKEN}")
    wait_for("the fleet page", lambda: driver.execute_script("return document.body.dataset.ready") == "fleet")


def open_machine_history(driver: webdriver.Chrome, base: str, machine: str) -> None:
    """A machine's page with all of its history (the All range); returns once that is drawn."""
    driver.get(f"{base}/dashboard/#/machine/{machine}")
    wait_for("the machine page", lambda: driver.execute_script("return document.body.dataset.ready") == "machine")
    click(driver, "the All range", "//div[@class='ranges']/button[text()='All']")
    wait_for(
        "all of its history",
        lambda: driver.execute_script(
            "return document.body.dataset.ready === 'machine'"
            " && document.querySelector('.ranges button.on')?.textContent === 'All'"
        ),
    )


def read(driver: webdriver.Chrome, selector: str, *attributes: str) -> list[list[str]]:
    """Attributes of every element a selector matches, read in one step (the page re-renders as events arrive)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => arguments[1].map(a => e.getAttribute(a)))",
        selector,
        list(attributes),
    )


def click(driver: webdriver.Chrome, what: str, xpath: str) -> None:
    """Clicks the element an XPath finds, finding it again if the page re-rendered it in between (a live event
    redraws the page, which leaves a found element stale) or if something still covered it."""

    def attempt() -> bool:
        try:
            element = driver.find_element(By.XPATH, xpath)
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
            element.click()
        except (StaleElementReferenceException, ElementClickInterceptedException, NoSuchElementException):
            return False
        return True

    wait_for(what, attempt)


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """The whole page, not just the window, as a PNG under the artifacts folder."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    height = min(int(size["height"]) + 1, 4000)
    # The machine page draws its charts again for a new viewport (a resize, debounced): wait for the new drawing.
    redraws = driver.execute_script(
        "window.__chartBefore = document.getElementById('risk-chart');"
        "return document.body.dataset.ready === 'machine' && !!window.__chartBefore"
        " && window.innerHeight !== arguments[0];",
        height,
    )
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1440, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    if redraws:
        wait_for(
            "the charts drawn for the new viewport",
            lambda: driver.execute_script(
                "const c = document.getElementById('risk-chart'); return !!c && c !== window.__chartBefore;"
            ),
        )
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path = ARTIFACTS / name
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size > 10_000
    return path
