"""Users, roles and ownership through the real API on a real server and store.

Every changing route, read from the app itself (so a route added later is covered without
a word here), is called without a token, with a revoked one, an expired one, a viewer's
and another team's member's: each answers 401 or 403 and the whole store is the same
before and after. No token is ever in a response (but the one that creates it), a log
line, an event or the store."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from tests.controller.account_scene import SPEC, Scene, open_scene, post_created
from tests.controller.test_migrations import dump

#: Changing routes that need no token: the dashboard's login and logout.
PUBLIC_CHANGES = {("POST", "/login"), ("POST", "/logout")}
#: Changing routes a member of any team may call: they name no job of another team
#: (submitting, registering a dataset or model, training a model: a job of their own).
OPEN_TO_MEMBERS = {
    ("POST", "/jobs"),
    ("POST", "/jobs/validate"),
    ("POST", "/datasets"),
    ("POST", "/models"),
    ("POST", "/models/{name}/train"),
}
#: A valid body for the routes that take one (a refusal must not be a 422).
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/jobs"): SPEC,
    ("POST", "/jobs/validate"): SPEC,
    ("PUT", "/jobs/{ref}/priority"): {"priority": 10},
    ("POST", "/jobs/{ref}/scale"): {"workers": 2},
    ("POST", "/jobs/{ref}/scale-out"): {"count": 1},
    ("POST", "/jobs/{ref}/scale-in"): {"count": 1},
    ("POST", "/jobs/{ref}/workers/stop"): {"workers": [0]},
    ("POST", "/jobs/{ref}/metrics"): {"step": 1, "values": {"loss": 1.0}},
    ("POST", "/users"): {"name": "eve", "role": "admin", "team": "vision"},
    ("PATCH", "/users/{name}"): {"role": "admin"},
    ("POST", "/tokens"): {"name": "spare", "user": "ana"},
}


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with open_scene(tmp_path) as opened:
        yield opened


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        # FastAPI keeps each included router as one entry holding the router's routes.
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)


def changing_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path template) of the app that may change something."""
    found = set()
    for route in _api_routes(app.routes):
        assert route.methods is not None
        for method in route.methods - {"GET", "HEAD", "OPTIONS"}:
            found.add((method, route.path))
    return sorted(found)


def _fill(path: str, scene: Scene) -> str:
    values = {"ref": scene.job, "user": "ana", "name": "laptop"}
    if path.startswith("/users/"):
        values["name"] = "ana"
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)


def test_the_changing_routes_are_found_and_only_login_and_logout_are_public(
    scene: Scene,
) -> None:
    routes = changing_routes(scene.app)
    assert ("POST", "/jobs/{ref}/cancel") in routes
    assert ("POST", "/tokens") in routes
    assert len(routes) >= 14
    for method, path in routes:
        if (method, path) in PUBLIC_CHANGES:
            continue
        response = httpx.request(method, f"{scene.url}{_fill(path, scene)}", timeout=10)
        assert response.status_code == 401, (method, path)


@pytest.mark.parametrize(
    ("who", "expected"),
    [(None, 401), ("revoked", 401), ("expired", 401), ("vic", 403), ("bob", 403)],
)
def test_every_changing_route_refuses_and_changes_nothing(
    scene: Scene, who: str | None, expected: int
) -> None:
    routes = [r for r in changing_routes(scene.app) if r not in PUBLIC_CHANGES]
    if who == "bob":
        routes = [r for r in routes if r not in OPEN_TO_MEMBERS]
    headers = {} if who is None else scene.as_(who)
    for method, path in routes:
        before = dump(scene.store.engine)
        response = httpx.request(
            method,
            f"{scene.url}{_fill(path, scene)}",
            json=BODIES.get((method, path)),
            headers=headers,
            timeout=10,
        )
        assert response.status_code == expected, (method, path, response.text)
        assert dump(scene.store.engine) == before, (method, path)
        if expected == 403:
            # The refusal names its reason.
            detail = response.json()["detail"]
            assert "viewer" in detail or "team" in detail or "admins" in detail, detail


def test_a_member_changes_the_jobs_of_their_team_only_and_the_change_is_audited(
    scene: Scene,
) -> None:
    url = scene.url
    mine = post_created(url, "/jobs", scene.tokens["bob"], {**SPEC, "name": "nlp-job"})
    assert (mine["owner"], mine["team"]) == ("bob", "nlp")
    record = scene.store.get_job(mine["id"])
    assert record is not None and (record.owner, record.team) == ("bob", "nlp")
    ana = scene.store.get_job(scene.job)
    assert ana is not None and (ana.owner, ana.team) == ("ana", "vision")

    refused = httpx.put(
        f"{url}/jobs/{scene.job}/priority", json={"priority": 20}, headers=scene.as_("bob")
    )
    assert refused.status_code == 403
    assert "team 'vision'" in refused.json()["detail"]
    too_high = httpx.put(
        f"{url}/jobs/{scene.job}/priority", json={"priority": 50_000}, headers=scene.as_("ana")
    )
    assert too_high.status_code == 403
    assert "priority" in too_high.json()["detail"]
    done = httpx.put(
        f"{url}/jobs/{scene.job}/priority",
        json={"priority": 20},
        headers={**scene.as_("ana"), "X-Tidal-Client": "cli"},
    )
    assert done.status_code == 200
    cancelled = httpx.post(f"{url}/jobs/{mine['id']}/cancel", headers=scene.as_("admin"))
    assert cancelled.status_code == 202

    by_ana = httpx.get(f"{url}/events", params={"actor": "ana"}, headers=scene.as_("vic"))
    assert by_ana.status_code == 200
    assert [(e["kind"], e["actor"], e["source"]) for e in by_ana.json()] == [
        ("submitted", "ana", "api"),
        ("priority", "ana", "cli"),
    ]
    events = scene.store.events(mine["id"])
    assert [(e.kind, e.actor) for e in events] == [
        ("submitted", "bob"),
        ("cancel_requested", "admin"),
    ]


def test_logs_and_metrics_are_for_the_team_and_admins(scene: Scene) -> None:
    for path in (f"/jobs/{scene.job}/metrics", f"/jobs/{scene.job}/logs"):
        assert httpx.get(f"{scene.url}{path}", headers=scene.as_("bob")).status_code == 403
        for who in ("ana", "vic", "admin"):
            answer = httpx.get(f"{scene.url}{path}", headers=scene.as_(who))
            assert answer.status_code == 200, (who, path)
    scene.store.add_metrics(scene.job, 1, {"loss": 0.5})
    for who, seen in (("bob", []), ("ana", [scene.job]), ("admin", [scene.job])):
        progress = httpx.get(f"{scene.url}/progress", headers=scene.as_(who)).json()
        assert [p["job_id"] for p in progress] == seen, who
    # The job itself is visible to every user.
    assert httpx.get(f"{scene.url}/jobs/{scene.job}", headers=scene.as_("bob")).status_code == 200


def test_only_admins_manage_users_and_other_users_tokens(scene: Scene) -> None:
    for who in ("ana", "vic"):
        assert httpx.get(f"{scene.url}/users", headers=scene.as_(who)).status_code == 403
        others = httpx.get(f"{scene.url}/tokens?user=bob", headers=scene.as_(who))
        assert others.status_code == 403
        assert "only their own tokens" in others.json()["detail"]
    me = httpx.get(f"{scene.url}/me", headers=scene.as_("vic")).json()
    assert (me["name"], me["role"], me["team"]) == ("vic", "viewer", "vision")
    listed = httpx.get(f"{scene.url}/tokens", headers=scene.as_("admin")).json()
    assert {(t["user"], t["name"]) for t in listed} >= {("admin", "data-dir"), ("ana", "laptop")}
    # Removing a user ends their tokens at once.
    gone = httpx.delete(f"{scene.url}/users/bob", headers=scene.as_("admin"))
    assert gone.status_code == 200
    assert httpx.get(f"{scene.url}/jobs", headers=scene.as_("bob")).status_code == 401
    last = httpx.delete(f"{scene.url}/users/admin", headers=scene.as_("admin"))
    assert last.status_code == 409
    assert "last admin" in last.json()["detail"]


def test_no_token_is_ever_shown_logged_or_stored_in_clear(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answers: list[str] = []
    created = httpx.post(
        f"{scene.url}/tokens", json={"name": "ci", "user": "bob"}, headers=scene.as_("admin")
    )
    assert created.status_code == 201
    new = created.json()["token"]
    secrets = {*scene.tokens.values(), new}
    paths = ["/jobs", f"/jobs/{scene.job}", "/events", "/tokens", "/users", "/me", "/metrics"]
    for who in ("admin", "ana", "vic", "revoked", "expired"):
        for path in paths:
            response = httpx.get(f"{scene.url}{path}", headers=scene.as_(who))
            answers.append(response.text + json.dumps(dict(response.headers)))
    login = httpx.post(f"{scene.url}/login", json={"token": new})
    assert login.status_code == 204
    answers.append(login.text + json.dumps(dict(login.headers)))
    stored = json.dumps(dump(scene.store.engine), default=str)
    events = json.dumps([e.__dict__ for e in scene.store.events()], default=str)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in secrets:
        assert all(secret not in a for a in answers)
        assert secret not in stored
        assert secret not in events
        assert secret not in logged
    # The store holds the keyed hashes.
    assert scene.store.has_token(scene.key.digest(new))


def test_a_member_submits_only_to_their_own_team_and_an_admin_to_any(scene: Scene) -> None:
    before = dump(scene.store.engine)
    response = httpx.post(
        f"{scene.url}/jobs",
        json={**SPEC, "name": "elsewhere", "team": "vision"},
        headers=scene.as_("bob"),
        timeout=10,
    )
    assert response.status_code == 403, response.text
    assert "team" in response.json()["detail"]
    assert dump(scene.store.engine) == before
    mine = post_created(
        scene.url, "/jobs", scene.tokens["bob"], {**SPEC, "name": "own", "team": "nlp"}
    )
    assert mine["team"] == "nlp"
    theirs = post_created(
        scene.url, "/jobs", scene.tokens["admin"], {**SPEC, "name": "x", "team": "nlp"}
    )
    assert (theirs["owner"], theirs["team"]) == ("admin", "nlp")
