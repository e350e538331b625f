"""The real browser the dashboard's browser tests drive: Debian's Chromium, headless,
through Playwright (its own browser download is not used), and the login every test
starts with.

Import this module's fixtures into a test module: outside CI, a machine without the
browser skips that module and says why; in CI (``make test`` installs Chromium) a missing
browser is a failure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "dashboard"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not os.environ.get("CI"):
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing (make test installs it: apt-get install chromium)",
            allow_module_level=True,
        )
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

#: How long an assertion on a page waits for it to come true, as long as an action waits
#: (the contexts' default timeout): Playwright's 5 s is short for a page that reads the API
#: first on a machine shared with other test runs.
WAIT_MS = 15_000
expect.set_options(timeout=WAIT_MS)

__all__ = ["ARTIFACTS", "Browser", "Page", "browser", "expect", "log_in", "page", "shot"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless; Playwright's own browser download is not used."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookie) with a desktop-sized window; the test fails on
    any JavaScript error the page raised."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    tab = context.new_page()
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
        assert errors == [], f"JavaScript errors: {errors}"
    finally:
        context.close()


def shot(page: Page, name: str, full_page: bool = True) -> None:
    """A screenshot of ``page`` in ``artifacts/dashboard/NAME.png``."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def log_in(page: Page, url: str, token: str) -> None:
    """Log in through the login page with ``token``; the jobs page is shown after."""
    page.goto(f"{url}/")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator("#jobs-table")).to_be_visible()
