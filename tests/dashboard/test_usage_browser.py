"""The cluster page's usage chart in a real browser (Debian's Chromium, driven by
Playwright) against a real API server: one band per job that held slots, stacked, the
priority change marked, utilisation beside it."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import Served

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "dashboard"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-component-update"]

# As tests/dashboard/test_browser.py: outside CI a machine without the browser skips.
if not os.environ.get("CI"):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

# A loaded machine renders slowly: an assertion waits longer than the default 5 s.
expect.set_options(timeout=30_000)


@pytest.fixture
def page() -> Iterator[Page]:
    """A fresh headless browser page; fails the test on any JavaScript error."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1100})
            context.set_default_timeout(20_000)
            tab = context.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            yield tab
            assert errors == [], f"JavaScript errors: {errors}"
        finally:
            browser.close()


def test_the_usage_chart_has_one_band_per_job(served: Served, page: Page) -> None:
    with served.client() as client:
        first = client.submit({"name": "first", "command": "x", "workers": "1:4"}).id
        second = client.submit({"name": "second", "command": "x", "workers": "1:4"}).id
        idle = client.submit({"name": "idle", "command": "x", "workers": "1:4"}).id
        client.cancel(idle)  # never held a slot: no band
        served.controller.tick()  # greedy: the first takes all 4 slots
        client.priority(second, 9000)
        # Now the second, at the higher priority, takes them: the first's are released,
        # then handed over (a tick each).
        for _ in range(10):
            served.controller.tick()
            if len(client.get(second).slots) == 4:
                break
        assert len(client.get(second).slots) == 4

    page.goto(f"{served.url}/login")
    page.fill("#token", served.token)
    page.click("button[type=submit]")
    expect(page.locator("#jobs-table")).to_be_visible()
    page.goto(f"{served.url}/#/cluster")

    chart = page.locator("#usage-chart")
    expect(chart).to_have_attribute(
        "data-bands", json.dumps([first, second], separators=(",", ":"))
    )
    # uPlot drew a series for each band (and the time axis and the cluster's size).
    expect(chart.locator(".u-legend .u-series")).to_have_count(1 + 2 + 1)
    expect(page.locator("#usage-legend .usage-band")).to_have_count(2)
    expect(page.locator(f'#usage-legend .usage-band[data-job="{second}"]')).to_contain_text(
        "4 slot(s) now"
    )
    marks = json.loads(chart.get_attribute("data-marks") or "[]")
    assert [second, "priority"] in [m[1:] for m in marks]
    assert [first, "preempted"] in [m[1:] for m in marks]  # its slots went to the second
    points = json.loads(chart.get_attribute("data-points") or "[]")
    top_band, bottom_band = points[1], points[2]  # drawn top band first
    assert top_band[-1] == 4 and bottom_band[-1] == 0  # the second on top of the first's 0
    expect(page.locator("#usage-util-chart")).to_have_attribute("data-last", re.compile("100"))
    page.screenshot(path=str(ARTIFACTS / "cluster-usage.png"), full_page=True)
