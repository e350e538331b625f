"""The cluster page's Drain button in a real browser (Debian's Chromium, driven by
Playwright) against a real API server over two hosts: Drain asks for a deadline, the host
reads draining with the job still on it, the store and ``GET /cluster`` say so, the job
moves off at its next step boundary and the host reads drained; Undrain puts it back in
service and the job grows onto it again. The fake backend applies a change only at the
job's next step boundary (``advance``); the test ticks the loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.controller.conftest import Served, serve
from tests.controller.fakes import FakeBackend
from tests.dashboard import chromium
from tests.dashboard.chromium import Page, expect, log_in, shot
from tidal.controller.cluster import ClusterHost, ClusterModel
from tidal.policy.fairshare import FairSharePolicy

if TYPE_CHECKING:
    from playwright.sync_api import Dialog

# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page

HOSTS = ClusterModel((ClusterHost("node-a", 4), ClusterHost("node-b", 4)))


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Served]:
    """A real API server over two hosts of 4 slots, fairshare, and a backend whose jobs
    apply a change at their next step boundary."""
    with serve(tmp_path, HOSTS, FairSharePolicy(), FakeBackend(instant=False)) as served:
        yield served


def settle(served: Served) -> None:
    """One decision, the job's step boundary, and the tick that sees it."""
    served.controller.tick()
    served.backend.advance()
    served.controller.tick()


def test_drain_and_undrain_a_host_from_the_cluster_page(two_hosts: Served, page: Page) -> None:
    client = two_hosts.client()
    job = client.submit({"name": "e", "command": "x", "workers": "2:8"}).id
    settle(two_hosts)
    assert {h for h, _ in client.get(job).slots} == {"node-a", "node-b"}

    log_in(page, two_hosts.url, two_hosts.token)
    page.goto(f"{two_hosts.url}/#/cluster")
    row = page.locator('.host-row[data-host="node-a"]')
    button = row.locator("button.drain")
    expect(row.locator(f'.slot.used[data-job="{job}"]')).to_have_count(4)
    expect(button).to_have_text("Drain")

    # Drain asks for a deadline: each answer in turn (None: dismiss the question).
    answers: list[str | None] = []
    asked: list[str] = []

    def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        reply = answers.pop(0)
        if reply is None:
            dialog.dismiss()
        else:
            dialog.accept(reply)

    page.on("dialog", answer)
    answers.append(None)
    button.click()  # dismissed: nothing drained
    answers.append("soon")
    button.click()  # not a number: refused in the page, nothing drained
    expect(page.locator("#cluster-message")).to_have_text(
        "node-a: deadline: expected a number of seconds > 0, got 'soon'"
    )
    assert next(h for h in client.cluster().hosts if h.name == "node-a").draining is None
    assert "node-a" not in two_hosts.store.drains()

    at = time.time()
    answers.append("120")
    button.click()
    expect(row.locator(".draining")).to_contain_text(f"still on it: {job}")
    expect(row.locator(".draining")).to_contain_text("draining (admin, goes in")
    expect(button).to_have_text("Undrain")
    assert len(asked) == 3 and all("Deadline in seconds" in m for m in asked)
    expect(page.locator("#cluster-message")).to_have_text("")
    drain = two_hosts.store.drains()["node-a"]
    assert drain.source.value == "admin"
    assert drain.leaves_at is not None and at + 100 < drain.leaves_at <= time.time() + 120
    view = next(h for h in client.cluster().hosts if h.name == "node-a")
    assert view.draining is not None and view.draining.remaining == [job]

    settle(two_hosts)  # the job leaves node-a at its step boundary
    assert {h for h, _ in client.get(job).slots} == {"node-b"}
    expect(row.locator(".draining")).to_contain_text("drained")
    expect(row.locator(".slot.free")).to_have_count(4)
    shot(page, "cluster-drained")

    button.click()  # Undrain: no question
    assert answers == [] and len(asked) == 3
    expect(button).to_have_text("Drain")
    expect(row.locator(".draining")).to_have_count(0)
    assert "node-a" not in two_hosts.store.drains()
    assert next(h for h in client.cluster().hosts if h.name == "node-a").draining is None
    settle(two_hosts)  # the job grows back onto node-a
    assert len(client.get(job).slots) == 8
    expect(row.locator(f'.slot.used[data-job="{job}"]')).to_have_count(4)
