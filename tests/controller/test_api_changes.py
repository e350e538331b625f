"""``GET /jobs?since=``: only the jobs changed after a change cursor, so a client that polls
(the dashboard) reads what changed rather than every job again; and the change numbers
behind it, given in commit order even with writers in several threads."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.controller.conftest import Served
from tidal.controller.store.jobs import JobStore
from tidal.spec import parse_spec

#: More workers than the test cluster's 4 slots: these jobs stay queued, unchanged.
WAITING = {"command": "python train.py", "workers": "5:6"}


@pytest.fixture
def http(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=30
    )


def submit(http: httpx.Client, count: int) -> list[str]:
    ids = []
    for i in range(count):
        response = http.post("/jobs", json={**WAITING, "name": f"j{i}"})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


def changed(http: httpx.Client, since: str, **params: str | int) -> tuple[list[str], str]:
    response = http.get("/jobs", params={"since": since, **params})
    assert response.status_code == 200, response.text
    return [j["id"] for j in response.json()], response.headers["x-change-cursor"]


def test_since_lists_only_the_jobs_changed_after_the_cursor(
    served: Served, http: httpx.Client
) -> None:
    ids = submit(http, 5)
    served.controller.tick()  # the loop's first look at the new jobs
    listed = http.get("/jobs")
    start = listed.headers["x-change-cursor"]
    assert changed(http, start) == ([], start)  # nothing changed since
    assert http.put(f"/jobs/{ids[2]}/priority", json={"priority": 9000}).status_code == 200
    seen, after_priority = changed(http, start)
    assert seen == [ids[2]]
    assert int(after_priority) > int(start)
    assert changed(http, after_priority) == ([], after_priority)
    # A cancel changes the job twice (asked, then carried out by the loop): both are seen.
    assert http.post(f"/jobs/{ids[4]}/cancel").status_code == 202
    seen, cursor = changed(http, after_priority)
    assert seen == [ids[4]]
    # The tick applies the priority asked earlier too: that is a change of its job.
    served.controller.tick()
    response = http.get("/jobs", params={"since": cursor})
    assert {j["id"]: (j["state"], j["priority"]) for j in response.json()} == {
        ids[2]: ("queued", 9000),
        ids[4]: ("cancelled", 5000),
    }
    served.controller.tick()  # nothing to do: nothing changes
    final = response.headers["x-change-cursor"]
    assert changed(http, final) == ([], final)


def test_a_full_page_of_changes_continues_after_its_last_job(http: httpx.Client) -> None:
    ids = submit(http, 3)
    start = http.get("/jobs").headers["x-change-cursor"]
    for job_id in (ids[1], ids[0], ids[2]):
        assert http.put(f"/jobs/{job_id}/priority", json={"priority": 7000}).status_code == 200
    first, cursor = changed(http, start, limit=2)
    assert first == [ids[1], ids[0]]  # in the order they changed
    rest, last = changed(http, cursor, limit=2)
    assert rest == [ids[2]]
    assert changed(http, last, limit=2) == ([], last)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "-1"}, "since"),
        ({"since": "x"}, "since"),
        ({"since": str(2**63)}, "since"),
        ({"since": "0", "after": "WzEuMCwgImEiXQ"}, "since"),
    ],
)
def test_a_bad_since_names_the_parameter(
    http: httpx.Client, params: dict[str, str], field: str
) -> None:
    response = http.get("/jobs", params=params)
    assert response.status_code == 422, response.text
    assert field in response.text


def test_change_numbers_follow_commits_with_concurrent_writers(tmp_path: Path) -> None:
    """Writers in several threads change jobs while a reader polls with ``since`` (small
    pages): the reader ends up with every job's final value, and no two jobs ever share a
    change number."""
    store = JobStore.open(tmp_path / "data")
    try:
        ids = [store.add_job(parse_spec({**WAITING, "name": f"j{i}"})).id for i in range(6)]
        seen: dict[str, int] = {}
        cursor = store.job_page(limit=100).change

        def write(offset: int) -> None:
            for k in range(40):
                store.update_job(ids[(offset + k) % len(ids)], priority=1 + offset * 1000 + k)

        def poll() -> None:
            nonlocal cursor
            page = store.job_page(limit=2, since=cursor)
            for job in page.jobs:
                seen[job.id] = job.priority  # type: ignore[union-attr]
            cursor = page.change

        writers = [threading.Thread(target=write, args=(n,)) for n in range(3)]
        for thread in writers:
            thread.start()
        while any(t.is_alive() for t in writers):
            poll()
        for thread in writers:
            thread.join()
        for _ in range(len(ids)):  # drain: pages of 2
            poll()
        final = {j.id: j.priority for j in store.list_jobs()}
        assert seen == final
        with store.engine.connect() as conn:
            numbers = [n for (n,) in conn.execute(text("SELECT change FROM jobs"))]
        assert len(set(numbers)) == len(numbers), numbers
    finally:
        store.close()
