"""The one-time login link in a real browser, from a real ``tidal server`` process: the link
it printed at start logs Chromium in once and leaves no nonce in the address bar or the
history; a second use is refused; ``tidal login-link`` makes a new one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dashboard import chromium
from tests.dashboard.chromium import Browser, Page, expect, shot
from tidal.controller.routes.auth import SESSION_COOKIE

pytestmark = pytest.mark.slow
# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page

_LINK = re.compile(r"log in once within 5 minutes \(`tidal login-link` makes more\):\n  (\S+)")


@dataclass
class Started:
    """A ``tidal server`` and what it printed at start."""

    url: str
    token: str
    link: str
    data_dir: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """``tidal server --slots 1`` with no job, its output read as a user reads it."""
    tmp = tmp_path_factory.mktemp("login-link")
    data = tmp / "data"
    out = tmp / "server.out"
    env = dict(os.environ, TIDAL_HOME=str(tmp / "home"), COLUMNS="200")
    with out.open("w") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tidal.cli", "server", "--slots", "1"),
                *("--data-dir", str(data), "--standby-workers", "0"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    try:
        deadline = time.monotonic() + 90
        while not _LINK.search(out.read_text()):
            assert process.poll() is None, out.read_text()
            assert time.monotonic() < deadline, f"no login link printed: {out.read_text()}"
            time.sleep(0.2)
        text = out.read_text()
        printed = re.search(r"dashboard: (\S+)/ \(token: (\S+)\)", text)
        link = _LINK.search(text)
        assert printed and link, text
        yield Started(printed.group(1), printed.group(2), link.group(1), data, env)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _refused(browser: Browser, link: str) -> None:
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(link)
        expect(tab).to_have_url(re.compile(r"/login\?link=refused$"))
        expect(tab.locator("#login-error")).to_contain_text("used already or has expired")
        assert context.cookies() == []
    finally:
        context.close()


def test_the_printed_link_logs_in_once_and_leaves_no_nonce_behind(
    started: Started, browser: Browser, page: Page
) -> None:
    assert started.link.startswith(f"{started.url}/login/link?nonce=")
    assert started.token not in started.link, "the token is never in a URL"

    page.goto(started.link)
    expect(page.locator("#jobs-table")).to_be_visible()
    assert page.url == f"{started.url}/", page.url
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    assert cookies.get(SESSION_COOKIE), cookies
    assert started.token not in cookies.values(), "a session id, never the token"
    # The redirect replaced the link in the history: back goes where the tab was before.
    page.go_back()
    assert page.url == "about:blank", page.url
    shot(page, "login-link-used")

    _refused(browser, started.link)


def test_tidal_login_link_prints_a_new_link(started: Started, browser: Browser, page: Page) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "login-link", "--data-dir", str(started.data_dir)],
        capture_output=True,
        text=True,
        env=started.env,
        timeout=60,
        check=True,
    )
    link = made.stdout.strip()
    assert link.startswith(f"{started.url}/login/link?nonce=") and link != started.link
    assert "good for one login, within 5 minute(s)" in made.stderr
    page.goto(link)
    expect(page.locator("#jobs-table")).to_be_visible()
    assert "nonce" not in page.url
    _refused(browser, link)
