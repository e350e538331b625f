"""The dashboard in a real browser against a real ``tidal server`` running real jobs.

Headless Chromium (Debian's, driven by Playwright) logs in with the token the server
printed, sees two jobs running, raises one's priority through the job page and watches its
allocation chart change, gets field errors for an invalid spec, cancels a job, stops a
worker, and is refused with a wrong token. The server is shared by the module's tests;
each test runs its own jobs and ends them, so none depends on another's having run (or
not). Screenshots go to ``artifacts/dashboard/``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard import chromium
from tests.dashboard.chromium import Page, expect, log_in, shot
from tests.dashboard.conftest import Served
from tidal.client import Client

pytestmark = pytest.mark.slow
# The real browser (skipped, saying why, where there is none outside CI).
browser = chromium.browser
page = chromium.page

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits_mlp.py"
SLOTS = 4


@dataclass
class Scene:
    """The shared server, and the jobs one test runs on it (none: the server alone)."""

    url: str
    token: str
    client: Client
    jobs: tuple[str, ...] = ()


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _spec(name: str, tmp: Path) -> dict[str, Any]:
    return {
        "name": name,
        "command": [
            "python",
            str(EXAMPLE),
            "--epochs",
            "500",  # outlasts the test; cancelled at its end
            "--step-delay",
            "0.05",
            "--result",
            str(tmp / f"{name}.json"),
        ],
        "workers": {"min": 1, "max": SLOTS},
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """``tidal server --slots 4``, no job on it: each test brings its own and ends them."""
    tmp = tmp_path_factory.mktemp("dashboard")
    data = tmp / "data"
    out = tmp / "server.out"
    with out.open("w") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tidal.cli", "server"),
                *("--slots", str(SLOTS), "--data-dir", str(data), "--standby-workers", "0"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, TIDAL_HOME=str(tmp / "home"), COLUMNS="200"),
        )
    try:
        _until(lambda: (data / "server.json").exists(), 60, "the server to start")
        # The token as a user would take it: from what the server printed at first start.
        _until(lambda: "dashboard:" in out.read_text(), 10, "the dashboard line")
        printed = re.search(r"dashboard: (\S+)/ \(token: (\S+)\)", out.read_text())
        assert printed, out.read_text()
        url, token = printed.group(1), printed.group(2)
        assert token == (data / "token").read_text().strip()
        with Client(url=url, token=token, timeout=30) as client:
            yield Scene(url, token, client)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        left = subprocess.run(
            ["pgrep", "-f", f"tidal.launch.agent .*{tmp}"], capture_output=True, text=True
        )
        assert left.stdout == "", "agents left behind"


@contextlib.contextmanager
def _running(server: Scene, tmp: Path, names: tuple[str, ...], each: int) -> Iterator[Scene]:
    """The jobs ``names`` submitted to the shared server, each with ``each`` workers
    running; cancelled, and ended, once the test is done, so the next test finds every
    slot free."""
    client = server.client
    jobs: list[str] = []
    try:
        for name in names:
            jobs.append(client.submit(_spec(name, tmp)).id)

        def running(job: str) -> int:
            return sum(w.state == "running" for w in client.get(job).worker_list)

        _until(lambda: all(running(j) == each for j in jobs), 180, f"{each} workers running each")
        yield replace(server, jobs=tuple(jobs))
    finally:
        for job in jobs:
            with contextlib.suppress(Exception):
                client.cancel(job)
        _until(
            lambda: all(client.get(j).state == "cancelled" for j in jobs), 120, "the jobs to end"
        )


@pytest.fixture
def pair(server: Scene, tmp_path: Path) -> Iterator[Scene]:
    """Two digits jobs sharing the server 2 / 2, the first with training metrics."""
    with _running(server, tmp_path, ("digits-a", "digits-b"), 2) as scene:
        for step in range(0, 200, 10):
            scene.client.report_metrics(
                scene.jobs[0], step, {"loss": 2.0 / (1 + step / 40), "accuracy": step / 220}
            )
        yield scene


@pytest.fixture
def alone(server: Scene, tmp_path: Path) -> Iterator[Scene]:
    """One digits job, alone on the server: it runs on every slot."""
    with _running(server, tmp_path, ("digits-alone",), SLOTS) as scene:
        yield scene


def _log_in(page: Page, scene: Scene) -> None:
    log_in(page, scene.url, scene.token)


def test_wrong_token_is_refused(server: Scene, page: Page) -> None:
    page.goto(f"{server.url}/")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_have_text(re.compile("Wrong token"))
    shot(page, "login-refused")
    assert page.context.cookies() == []
    page.goto(f"{server.url}/")
    expect(page).to_have_url(re.compile(r"/login$"))


def test_jobs_page_lists_both_running_jobs(pair: Scene, page: Page) -> None:
    _log_in(page, pair)
    for job in pair.jobs:
        row = page.locator(f'#jobs-table tr[data-job="{job}"]')
        expect(row).to_have_attribute("data-state", "running")
        expect(row).to_contain_text("2 / 1–4")
    expect(page.locator("#job-counts")).to_have_text(re.compile(r"2 running"))
    shot(page, "jobs")


def test_raising_a_priority_moves_slots_on_the_allocation_chart(pair: Scene, page: Page) -> None:
    _log_in(page, pair)
    first, second = pair.jobs
    page.click(f'#jobs-table tr[data-job="{second}"] a')
    chart = page.locator("#alloc-chart")
    expect(chart).to_have_attribute("data-last", "2")
    before = chart.get_attribute("data-points")
    expect(page.locator("#events-table")).to_contain_text("started")

    page.fill("#priority-input", "10000")
    page.click("#priority-set")
    expect(page.locator("#priority-now")).to_have_text("10000")
    # 4 slots at priorities 5000 and 10000: fair share makes it 1 / 3.
    expect(chart).to_have_attribute("data-last", "3", timeout=120_000)
    assert chart.get_attribute("data-points") != before
    expect(page.locator("#workers-now")).to_have_text("3")
    assert [a.count for a in pair.client.allocations(second)][-1] == 3
    _until(lambda: pair.client.allocations(first)[-1].count == 1, 60, "the first job at 1")
    expect(page.locator("#events-table")).to_contain_text("priority")
    shot(page, "job-after-priority")

    page.goto(f"{pair.url}/#/jobs/{first}")
    expect(page.locator("#alloc-chart")).to_have_attribute("data-last", "1")
    expect(page.locator('.chart[data-metric="loss"]')).to_have_attribute(
        "data-points", re.compile("190")
    )
    shot(page, "job-with-metrics")

    page.goto(f"{pair.url}/#/cluster")
    expect(page.locator(f'#slot-grid .slot[data-job="{second}"]')).to_have_count(3)
    expect(page.locator(f'#slot-grid .slot[data-job="{first}"]')).to_have_count(1)
    shot(page, "cluster")


def test_invalid_spec_shows_its_field_errors_next_to_their_lines(server: Scene, page: Page) -> None:
    jobs = [j.id for j in server.client.list()]
    _log_in(page, server)
    page.click('nav a[data-nav="submit"]')
    page.fill(
        "#spec-text",
        "name: Bad Name\ncommand: python x.py\nworkers:\n  min: 4\n  max: 2\n"
        "resources: {memory: 12Q}\nsurprise: 1\n",
    )
    notes = page.locator("#spec-annotated .note")
    expect(notes).to_have_count(4)
    expect(page.locator('#spec-annotated .note[data-path="workers.min"]')).to_have_attribute(
        "data-line", "4"
    )
    expect(page.locator('#spec-annotated .note[data-path="workers.min"]')).to_contain_text(
        "must be ≤ workers.max (got 4 > 2)"
    )
    expect(page.locator('#spec-annotated .note[data-path="surprise"]')).to_contain_text(
        "unknown field"
    )
    page.click("#spec-submit")
    expect(page.locator("#spec-status")).to_contain_text("Refused")
    shot(page, "submit-invalid")
    assert [j.id for j in server.client.list()] == jobs, "nothing was submitted"


def test_cancel_asks_first_then_ends_the_job(alone: Scene, page: Page) -> None:
    _log_in(page, alone)
    job = alone.jobs[0]
    page.goto(f"{alone.url}/#/jobs/{job}")
    expect(page.locator("#workers-now")).to_have_text(str(SLOTS))
    dialog = page.locator("#cancel-dialog")
    page.click("#cancel-job")
    expect(dialog).to_be_visible()
    shot(page, "cancel-confirm", full_page=False)  # the modal's backdrop covers the viewport
    page.click("#cancel-no")
    expect(dialog).to_be_hidden()
    assert not alone.client.get(job).cancel_requested, "kept running when told to"
    page.click("#cancel-job")
    page.click("#cancel-yes")
    expect(page.locator(".page-head .badge")).to_have_text("cancelled", timeout=60_000)
    expect(page.locator("#cancel-job")).to_be_disabled()


def test_a_worker_is_stopped_from_its_row_after_a_confirmation(alone: Scene, page: Page) -> None:
    job = alone.jobs[0]

    def running() -> list[int]:
        return [w.worker_id for w in alone.client.get(job).worker_list if w.state == "running"]

    _until(lambda: len(running()) == SLOTS, 120, f"{job} on all {SLOTS} slots")
    _log_in(page, alone)
    page.goto(f"{alone.url}/#/jobs/{job}")
    expect(page.locator("#workers-now")).to_have_text(str(SLOTS))
    victim = running()[-1]
    row = page.locator(f'#workers-table tr[data-worker="{victim}"]')
    dialog = page.locator("#stop-worker-dialog")
    row.locator(".stop-worker").click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Worker {victim} (worker,")
    shot(page, "stop-worker-confirm", full_page=False)
    page.click("#stop-worker-no")
    expect(dialog).to_be_hidden()
    assert "stop_workers" not in {e.kind for e in alone.client.events(job)}, "stopped when kept"

    row.locator(".stop-worker").click()
    page.click("#stop-worker-yes")
    expect(page.locator("#action-msg")).to_contain_text(f"Stop worker {victim}: done")
    # An elastic job is scaled in by one: it stays one worker smaller.
    expect(page.locator("#workers-now")).to_have_text(str(SLOTS - 1), timeout=60_000)
    # It leaves the live workers the table shows by default, and is listed released.
    expect(row).to_have_count(0, timeout=60_000)
    page.select_option("#workers-filter", "all")
    expect(row).to_have_attribute("data-state", "released")
    expect(row.locator(".stop-worker")).to_have_count(0)
    expect(page.locator("#events-table")).to_contain_text(f"stop worker(s) {victim}")
    assert alone.client.get(job).target_slots == SLOTS - 1


def test_workers_of_two_gpus_are_counted_as_workers(served: Served, page: Page) -> None:
    """A job of 1-2 workers of 2 GPUs each: the jobs table and the job page say workers
    (2, within 1-2, 2 slots each), not the 4 slots they hold."""
    with served.client() as client:
        job = client.submit(
            {"name": "pairs", "command": ["python", "t.py"], "workers": "1:2",
             "resources": {"gpus": 2}}
        ).id  # fmt: skip
        served.controller.tick()  # places it: two workers, four slots
        assert len(client.get(job).slots) == 4
    _log_in(page, Scene(served.url, served.token, client, (job, job)))
    row = page.locator(f'#jobs-table tr[data-job="{job}"]')
    expect(row).to_contain_text("2 / 1–2 ×2")
    page.click(f'#jobs-table tr[data-job="{job}"] a')
    expect(page.locator("#workers-now")).to_have_text("2")
    facts = page.locator("#workers-now").locator("xpath=..")
    expect(facts).to_contain_text("now · min 1 · max 2")
    expect(facts).to_contain_text("4 slots held · 2 per worker")
