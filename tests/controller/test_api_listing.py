"""Listing jobs through a real server: pages and cursors, the summary view, ETags, and a
row corrupted in the database shown as unreadable without breaking the page."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.controller.conftest import Served

#: More workers than the test cluster's 4 slots: these jobs stay queued, unchanged.
WAITING = {"command": "python train.py", "workers": "5:6"}


@pytest.fixture
def http(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=30
    )


def submit(http: httpx.Client, count: int, **extra: object) -> list[str]:
    ids = []
    for i in range(count):
        response = http.post("/jobs", json={**WAITING, "name": f"j{i}", **extra})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


def test_pages_follow_the_cursor_in_submission_order(served: Served, http: httpx.Client) -> None:
    ids = submit(http, 7)
    first = http.get("/jobs", params={"limit": 3})
    assert [j["id"] for j in first.json()] == ids[:3]
    cursor = first.headers["x-next-cursor"]
    assert 'rel="next"' in first.headers["link"]
    late = submit(http, 1)  # submitted between pages: it comes last, nothing shifts
    second = http.get("/jobs", params={"limit": 3, "after": cursor})
    assert [j["id"] for j in second.json()] == ids[3:6]
    third = http.get("/jobs", params={"limit": 3, "after": second.headers["x-next-cursor"]})
    assert [j["id"] for j in third.json()] == [ids[6], *late]
    assert "x-next-cursor" not in third.headers
    # The SDK (and so ``tidal list``) reads every page.
    assert [j.id for j in served.client().list()] == ids + late
    assert [j.id for j in served.client().list(limit=5)] == ids[:5]


def test_default_page_is_bounded(http: httpx.Client) -> None:
    submit(http, 101)
    page = http.get("/jobs")
    assert len(page.json()) == 100
    assert "x-next-cursor" in page.headers


def test_label_filter_pages_over_matching_jobs(served: Served, http: httpx.Client) -> None:
    plain = submit(http, 3)
    tagged = submit(http, 3, labels={"team": "nlp"})
    page = http.get("/jobs", params={"label": "team=nlp", "limit": 2})
    assert [j["id"] for j in page.json()] == tagged[:2]
    rest = http.get(
        "/jobs", params={"label": "team=nlp", "limit": 2, "after": page.headers["x-next-cursor"]}
    )
    assert [j["id"] for j in rest.json()] == tagged[2:]
    assert "x-next-cursor" not in rest.headers
    assert plain[0] not in {j["id"] for j in rest.json()}


def test_summary_by_default_full_spec_on_request(http: httpx.Client) -> None:
    (job_id,) = submit(http, 1)
    assert http.get("/jobs").json()[0]["spec"] is None
    assert http.get("/jobs", params={"view": "full"}).json()[0]["spec"]["command"] == [
        "python",
        "train.py",
    ]
    assert http.get(f"/jobs/{job_id}").json()["spec"]["command"] == ["python", "train.py"]


@pytest.mark.parametrize("cursor", ["nonsense", "W10", "WyJ4IiwxXQ", "%%%"])
def test_a_bad_cursor_names_the_parameter(http: httpx.Client, cursor: str) -> None:
    response = http.get("/jobs", params={"after": cursor})
    assert response.status_code == 422
    assert response.json()["detail"][0]["path"] == "after"


def test_an_unchanged_page_answers_304(http: httpx.Client) -> None:
    submit(http, 2)
    first = http.get("/jobs")
    etag = first.headers["etag"]
    again = http.get("/jobs", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    submit(http, 1)
    changed = http.get("/jobs", headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert len(changed.json()) == 3
    assert changed.headers["etag"] != etag


@pytest.mark.parametrize(
    "corruption",
    [
        "UPDATE jobs SET spec = '{not json' WHERE id = :id",
        "UPDATE jobs SET state = 'bogus' WHERE id = :id",
        "UPDATE jobs SET labels = '[1, 2' WHERE id = :id",
    ],
)
def test_a_corrupt_row_is_marked_not_fatal(
    served: Served, http: httpx.Client, corruption: str
) -> None:
    ids = submit(http, 3)
    with served.store.engine.begin() as conn:
        conn.execute(text(corruption), {"id": ids[1]})
    for params in ({}, {"state": ["queued", "running"]}, {"view": "full"}):
        response = http.get("/jobs", params=params)
        assert response.status_code == 200, response.text
        jobs = response.json()
        if params.get("state"):
            jobs = [j for j in jobs if j["id"] != ids[1]]  # 'bogus' no longer matches
        else:
            assert [j["id"] for j in jobs] == ids
            broken = jobs[1]
            assert broken["state"] == "unreadable"
            assert broken["name"] == "j1"
            assert "stored record cannot be read" in broken["reason"]
        assert {j["state"] for j in jobs if j["id"] != ids[1]} == {"queued"}
    assert [j.id for j in served.client().list()] == ids


@pytest.mark.parametrize(
    "corruption",
    [
        "UPDATE jobs SET spec = '{not json' WHERE id = :id",
        "UPDATE jobs SET state = 'bogus' WHERE id = :id",
    ],
)
def test_a_corrupt_row_answers_a_clear_error_for_that_job(
    served: Served, http: httpx.Client, corruption: str
) -> None:
    ids = submit(http, 2)
    with served.store.engine.begin() as conn:
        conn.execute(text(corruption), {"id": ids[1]})
    for ref in (ids[1], "j1"):  # by id and by name
        response = http.get(f"/jobs/{ref}")
        assert response.status_code == 409, response.text
        body = response.json()
        assert body["job"] == ids[1]
        assert body["state"] == "unreadable"
        assert "stored record cannot be read" in body["detail"]
    assert http.post(f"/jobs/{ids[1]}/cancel").status_code == 409
    assert http.get(f"/jobs/{ids[0]}").status_code == 200
    # The loop goes on with the readable jobs (it lists them every tick).
    served.controller.tick()
    assert http.post(f"/jobs/{ids[0]}/cancel").status_code == 202
    served.controller.tick()
    assert http.get(f"/jobs/{ids[0]}").json()["state"] == "cancelled"


def test_a_listed_job_is_listed_anew_after_each_change(served: Served, http: httpx.Client) -> None:
    """The listing keeps each job's JSON until the job changes: a request recorded, the
    loop applying it, a goodput report and a state change each show at once."""
    (job_id,) = submit(http, 1, priority=100)

    def listed() -> dict[str, Any]:
        (view,) = http.get("/jobs").json()
        assert isinstance(view, dict)
        return view

    assert (listed()["priority"], listed()["pending_requests"]) == (100, [])
    assert http.put(f"/jobs/{job_id}/priority", json={"priority": 900}).status_code == 200
    view = listed()
    assert view["priority"] == 900
    assert [r["kind"] for r in view["pending_requests"]] == ["priority"]
    served.controller.tick()  # applies it
    assert (listed()["priority"], listed()["pending_requests"]) == (900, [])
    served.store.set_goodput(job_id, {"batch_size": 64, "efficiency": 0.5, "speedup": 1.5})
    assert listed()["batch_size"] == 64
    assert http.post(f"/jobs/{job_id}/cancel").status_code == 202
    served.controller.tick()
    assert listed()["state"] == "cancelled"
