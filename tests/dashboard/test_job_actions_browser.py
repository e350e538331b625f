"""The job page offers its actions (priority, scale, cancel, stop a worker) only to those
the server lets change the job: admins, and members of the job's team. A viewer, or a
member of another team, sees why instead of buttons the server would refuse; and another
team's member, who may not read the job's metrics, still sees the rest of the page.

A real API server over the fake backend (the controller ticked by the test) and headless
Chromium, logged in with each user's own token.
"""

from __future__ import annotations

import pytest

from tests.dashboard import chromium
from tests.dashboard.chromium import Page, expect, log_in
from tests.dashboard.conftest import Served

pytestmark = pytest.mark.slow
# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page


@pytest.mark.parametrize(
    ("role", "team", "refusal"),
    [
        ("admin", "other", None),
        ("member", "default", None),
        ("member", "other", "team default's: you change only team other's jobs"),
        ("viewer", "default", "Viewers change no job"),
    ],
)
def test_the_actions_are_offered_to_those_who_may_change_the_job(
    served: Served, page: Page, role: str, team: str, refusal: str | None
) -> None:
    with served.client() as client:
        job = client.submit({"name": "j", "command": ["python", "t.py"], "workers": "1:2"})
        assert job.team == "default"
        served.controller.tick()  # its workers start
        served.controller.tick()  # and are seen running
        assert len(client.get(job.id).worker_list) == 2
        client.add_user("u", role=role, team=team)
        token = client.create_token("browser", user="u").token
    log_in(page, served.url, token)
    page.goto(f"{served.url}/#/jobs/{job.id}")
    expect(page.locator("#workers-table tbody tr")).to_have_count(2)
    expect(page.locator("#who")).to_contain_text(f"u ({role}")
    if refusal is None:
        expect(page.locator("#job-controls")).to_be_visible()
        expect(page.locator("#priority-set")).to_be_enabled()
        expect(page.locator(".stop-worker")).to_have_count(2)
        expect(page.locator("#actions-refused")).to_have_text("")
    else:
        expect(page.locator("#actions-refused")).to_contain_text(refusal)
        expect(page.locator("#job-controls")).to_be_hidden()
        expect(page.locator(".stop-worker")).to_have_count(0)
    if team != "default" and role != "admin":
        # Another team's member reads the job but not its metrics: the page says so.
        expect(page.locator("#metrics-refused")).to_contain_text("for that team and admins")
