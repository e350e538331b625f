"""What the dashboard shows of a job beyond its size: a finished job's state and size as it
ended, every role's command, labels, one colour per job, and the workers table's filter.

A real API server over the fake backend (the controller ticked by the test) and headless
Chromium: each test sets the scene through the SDK, then reads the pages.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.dashboard import chromium
from tests.dashboard.chromium import Page, expect, log_in, shot
from tests.dashboard.conftest import Served

pytestmark = pytest.mark.slow
# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page


def _spec(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "command": ["python", "t.py"], "workers": "1:4", **more}


def _show_all_jobs(page: Page) -> None:
    page.select_option("#filter-state", "all")


def test_a_cancelled_job_reads_cancelled_and_nothing_else(served: Served, page: Page) -> None:
    """A job whose cancel is done shows no "cancelling", even with its cancel request kept
    in the store (as earlier releases kept it after carrying it out)."""
    with served.client() as client:
        job = client.submit(_spec("gone")).id
        served.controller.tick()
        client.cancel(job)
        served.controller.tick()
        served.store.update_job(job, time.time(), cancel_requested=True)
        seen = client.get(job)
        assert seen.state == "cancelled" and seen.cancel_requested
    log_in(page, served.url, served.token)
    _show_all_jobs(page)
    row = page.locator(f'#jobs-table tr[data-job="{job}"]')
    expect(row).to_have_attribute("data-state", "cancelled")
    expect(row.locator(".badge")).to_have_text("cancelled")
    expect(row).not_to_contain_text("cancelling")
    page.goto(f"{served.url}/#/jobs/{job}")
    expect(page.locator(".page-head .badge")).to_have_text("cancelled")
    expect(page.locator("#job-reason")).not_to_contain_text("cancelling")


def test_a_finished_job_shows_what_it_ended_with_not_its_target(served: Served, page: Page) -> None:
    with served.client() as client:
        job = client.submit(_spec("done")).id
        served.controller.tick()  # the greedy policy gives it all 4 slots
        client.scale(job, 2)
        served.controller.tick()
        assert len(client.get(job).slots) == 2
        served.backend.finish(job)
        served.controller.tick()
        seen = client.get(job)
        assert seen.state == "succeeded" and seen.target_slots == 2 and seen.slots == []
    log_in(page, served.url, served.token)
    _show_all_jobs(page)
    row = page.locator(f'#jobs-table tr[data-job="{job}"]')
    expect(row).to_have_attribute("data-state", "succeeded")
    expect(row.locator("td.workers")).to_have_text(re.compile(r"^0 / 1–4$"))
    page.goto(f"{served.url}/#/jobs/{job}")
    expect(page.locator("#workers-now")).to_have_text("2")
    facts = page.locator("#workers-now").locator("xpath=..")
    expect(facts).to_contain_text("at the end · min 1 · max 4")
    expect(facts).not_to_contain_text("target")
    shot(page, "job-finished")


def test_each_role_of_a_job_shows_its_command(served: Served, page: Page) -> None:
    with served.client() as client:
        job = client.submit(
            {"name": "ps-job", "roles": [
                {"name": "ps", "command": ["python", "ps.py"], "replicas": 1, "launcher": "ps"},
                {"name": "worker", "command": ["python", "train.py", "--lr", "0.1"],
                 "replicas": "1:2", "launcher": "ps"},
            ]}
        ).id  # fmt: skip
    log_in(page, served.url, served.token)
    page.goto(f"{served.url}/#/jobs/{job}")
    command = page.locator("#job-command")
    expect(command.locator('[data-role="ps"]')).to_have_text("ps (ps): python ps.py")
    expect(command.locator('[data-role="worker"]')).to_have_text(
        "worker (ps): python train.py --lr 0.1"
    )


def test_labels_are_shown_in_the_list_and_on_the_job_page(served: Served, page: Page) -> None:
    with served.client() as client:
        job = client.submit(_spec("tagged", labels={"team": "vision", "exp": "lr-sweep"})).id
        plain = client.submit(_spec("plain")).id
    log_in(page, served.url, served.token)
    row = page.locator(f'#jobs-table tr[data-job="{job}"]')
    expect(row.locator(".label-chip")).to_have_text(["team=vision", "exp=lr-sweep"])
    expect(page.locator(f'#jobs-table tr[data-job="{plain}"] .label-chip')).to_have_count(0)
    page.click(f'#jobs-table tr[data-job="{job}"] a')
    expect(page.locator("#job-labels .label-chip")).to_have_text(["team=vision", "exp=lr-sweep"])


def test_every_job_shown_has_its_own_colour_on_every_page(served: Served, page: Page) -> None:
    # More jobs than a fixed palette of ten colours has: some would share one.
    count = 14
    with served.client() as client:
        jobs = [client.submit(_spec(f"job-{i}")).id for i in range(count)]
    log_in(page, served.url, served.token)
    swatches = page.locator("#jobs-table tbody tr td:first-child .swatch")
    expect(swatches).to_have_count(count)

    def colours() -> dict[str, str]:
        found: dict[str, str] = page.eval_on_selector_all(
            "#jobs-table tbody tr",
            "rows => Object.fromEntries(rows.map(r => "
            "[r.dataset.job, getComputedStyle(r.querySelector('.swatch')).backgroundColor]))",
        )
        return found

    listed = colours()
    assert set(listed) == set(jobs)
    assert len(set(listed.values())) == count, listed
    shot(page, "jobs-colours")

    # A job keeps its colour: on its own page, and after more jobs arrive.
    first = jobs[0]
    page.goto(f"{served.url}/#/jobs/{first}")
    expect(page.locator(".page-head .swatch")).to_have_css("background-color", listed[first])
    with served.client() as client:
        later = client.submit(_spec("later")).id
    page.goto(f"{served.url}/#/jobs")
    expect(page.locator(f'#jobs-table tr[data-job="{later}"]')).to_be_visible()
    again = colours()
    assert {j: again[j] for j in jobs} == listed
    assert again[later] not in listed.values()


def test_the_workers_table_shows_live_workers_unless_asked_for_all(
    served: Served, page: Page
) -> None:
    with served.client() as client:
        job = client.submit(_spec("shrunk")).id
        served.controller.tick()  # four workers
        client.scale(job, 2)
        served.controller.tick()  # two of them released
        served.controller.tick()  # and seen released
        states = sorted(w.state for w in client.get(job).worker_list)
        assert states == ["released", "released", "running", "running"], states
    log_in(page, served.url, served.token)
    page.goto(f"{served.url}/#/jobs/{job}")
    rows = page.locator("#workers-table tbody tr")
    expect(rows).to_have_count(2)
    for state in rows.evaluate_all("rows => rows.map(r => r.dataset.state)"):
        assert state == "running"
    expect(page.locator("#workers-hidden")).to_contain_text("2 more not shown")

    page.select_option("#workers-filter", "all")
    expect(rows).to_have_count(4)
    page.select_option("#workers-filter", "released")
    expect(rows).to_have_count(2)
    expect(page.locator('#workers-table tbody tr[data-state="released"]')).to_have_count(2)
