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
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from tests.controller.fakes import FakeBackend, GreedyPolicy
from tests.controller.test_migrations import dump
from tidal.controller.cluster import ClusterModel
from tidal.controller.credentials import ServerKey
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.server.app import create_app
from tidal.server.process import ApiServer

SPEC = {"name": "train", "command": "python train.py", "workers": "1:4"}

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


@dataclass
class Scene:
    """A server with users ``ana`` (member, vision), ``bob`` (member, nlp) and ``vic``
    (viewer, vision), a job of team vision, and tokens of each kind."""

    url: str
    app: FastAPI
    store: JobStore
    key: ServerKey
    tokens: dict[str, str]
    job: str

    def as_(self, who: str) -> dict[str, str]:
        """Headers that authenticate as ``who`` (a key of :attr:`tokens`)."""
        return {"Authorization": f"Bearer {self.tokens[who]}"}


def _post(url: str, path: str, token: str, body: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert response.status_code == 201, response.text
    found: dict[str, Any] = response.json()
    return found


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    data_dir = tmp_path / "data"
    admin = ensure_token(data_dir)
    key = ServerKey.in_data_dir(data_dir)
    store = JobStore.open(data_dir)
    controller = Controller(
        store, ClusterModel.single(4, name="h"), GreedyPolicy(), FakeBackend(), data_dir
    )
    app = create_app(controller, admin, key)
    server = ApiServer(app)
    server.start()
    try:
        url = server.url
        tokens = {"admin": admin}
        for name, role, team in [
            ("ana", "member", "vision"),
            ("bob", "member", "nlp"),
            ("vic", "viewer", "vision"),
        ]:
            _post(url, "/users", admin, {"name": name, "role": role, "team": team})
            tokens[name] = _post(url, "/tokens", admin, {"name": "laptop", "user": name})["token"]
        tokens["revoked"] = _post(url, "/tokens", admin, {"name": "old", "user": "ana"})["token"]
        revoked = httpx.post(
            f"{url}/tokens/ana/old/revoke", headers={"Authorization": f"Bearer {admin}"}
        )
        assert revoked.status_code == 200
        # Expired a second ago: written into the store as the server would have.
        tokens["expired"] = "an-expired-token-of-ana"
        store.add_token("ana", "expired", key.digest(tokens["expired"]), expires_at=time.time() - 1)
        job = _post(url, "/jobs", tokens["ana"], SPEC)["id"]
        yield Scene(url, app, store, key, tokens, job)
    finally:
        server.stop()
        store.close()


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
    mine = _post(url, "/jobs", scene.tokens["bob"], {**SPEC, "name": "nlp-job"})
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
    mine = _post(scene.url, "/jobs", scene.tokens["bob"], {**SPEC, "name": "own", "team": "nlp"})
    assert mine["team"] == "nlp"
    theirs = _post(scene.url, "/jobs", scene.tokens["admin"], {**SPEC, "name": "x", "team": "nlp"})
    assert (theirs["owner"], theirs["team"]) == ("admin", "nlp")


def _names(tokens: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(t["user"], t["name"]) for t in tokens}


def test_a_member_manages_their_own_tokens_and_not_another_users(scene: Scene) -> None:
    url, ana = scene.url, scene.as_("ana")
    made = httpx.post(f"{url}/tokens", json={"name": "ci", "expires_in_s": 3600}, headers=ana)
    assert made.status_code == 201, made.text
    assert (made.json()["user"], made.json()["name"]) == ("ana", "ci")
    assert made.json()["expires_at"] is not None
    ci = made.json()["token"]
    assert httpx.get(f"{url}/me", headers={"Authorization": f"Bearer {ci}"}).json()["name"] == "ana"
    # A viewer manages their own tokens too.
    assert (
        httpx.post(f"{url}/tokens", json={"name": "ci"}, headers=scene.as_("vic")).status_code
        == 201
    )

    listed = httpx.get(f"{url}/tokens", headers=ana)
    assert listed.status_code == 200
    assert _names(listed.json()) == {("ana", n) for n in ("laptop", "old", "expired", "ci")}
    assert all("token" not in t for t in listed.json())

    before = dump(scene.store.engine)
    for method, path, body in [
        ("GET", "/tokens?user=bob", None),
        ("POST", "/tokens", {"name": "mine-now", "user": "bob"}),
        ("POST", "/tokens/bob/laptop/revoke", None),
    ]:
        refused = httpx.request(method, f"{url}{path}", json=body, headers=ana, timeout=10)
        assert refused.status_code == 403, (method, path, refused.text)
        assert "only their own tokens" in refused.json()["detail"]
    assert dump(scene.store.engine) == before

    # Revoking the token a dashboard session was opened with ends the session.
    login = httpx.post(f"{url}/login", json={"token": ci})
    assert login.status_code == 204
    cookies = dict(login.cookies)
    assert httpx.get(f"{url}/me", cookies=cookies).status_code == 200
    revoked = httpx.post(f"{url}/tokens/ana/ci/revoke", headers=ana)
    assert revoked.status_code == 200, revoked.text
    assert httpx.get(f"{url}/me", cookies=cookies).status_code == 401
    assert httpx.get(f"{url}/me", headers={"Authorization": f"Bearer {ci}"}).status_code == 401
    audit = [(e.kind, e.actor, e.message) for e in scene.store.events() if e.actor == "ana"]
    assert ("token_created", "ana", "ana/ci") in audit
    assert ("token_revoked", "ana", "ana/ci") in audit


def test_an_admin_demotes_a_member_whose_next_change_is_refused(scene: Scene) -> None:
    url, admin = scene.url, {**scene.as_("admin"), "X-Tidal-Client": "cli"}
    priority = f"{url}/jobs/{scene.job}/priority"
    assert httpx.put(priority, json={"priority": 20}, headers=scene.as_("ana")).status_code == 200
    demoted = httpx.patch(f"{url}/users/ana", json={"role": "viewer"}, headers=admin)
    assert demoted.status_code == 200, demoted.text
    assert (demoted.json()["role"], demoted.json()["team"]) == ("viewer", "vision")
    refused = httpx.put(priority, json={"priority": 30}, headers=scene.as_("ana"))
    assert refused.status_code == 403
    assert "viewer" in refused.json()["detail"]
    # A new team takes effect at once too: bob may now change team vision's jobs.
    assert httpx.put(priority, json={"priority": 40}, headers=scene.as_("bob")).status_code == 403
    moved = httpx.patch(f"{url}/users/bob", json={"team": "vision"}, headers=admin)
    assert moved.status_code == 200, moved.text
    assert httpx.put(priority, json={"priority": 40}, headers=scene.as_("bob")).status_code == 200
    changes = [
        (e.kind, e.actor, e.source, e.message)
        for e in scene.store.events()
        if e.kind == "user_changed"
    ]
    assert changes == [
        ("user_changed", "admin", "cli", "ana: role member → viewer"),
        ("user_changed", "admin", "cli", "bob: team nlp → vision"),
    ]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"role": "owner"}, 422, "role"),
        ({"team": "Not A Team"}, 422, "team"),
        ({"role": "admin", "colour": "red"}, 422, "colour"),
        ({}, 422, "role"),
    ],
)
def test_a_bad_user_change_names_the_field_and_changes_nothing(
    scene: Scene, body: dict[str, Any], status: int, field: str
) -> None:
    before = dump(scene.store.engine)
    answer = httpx.patch(f"{scene.url}/users/ana", json=body, headers=scene.as_("admin"))
    assert answer.status_code == status, answer.text
    assert field in json.dumps(answer.json()["detail"])
    assert dump(scene.store.engine) == before
    missing = httpx.patch(
        f"{scene.url}/users/nobody", json={"role": "viewer"}, headers=scene.as_("admin")
    )
    assert missing.status_code == 404


def test_the_last_admin_cannot_be_demoted(scene: Scene) -> None:
    url, admin = scene.url, scene.as_("admin")
    before = dump(scene.store.engine)
    last = httpx.patch(f"{url}/users/admin", json={"role": "member"}, headers=admin)
    assert last.status_code == 409
    assert last.json()["detail"].startswith("role: 'admin' is the last admin")
    assert dump(scene.store.engine) == before
    # With a second admin, the first may step down.
    assert httpx.patch(f"{url}/users/ana", json={"role": "admin"}, headers=admin).status_code == 200
    stepped = httpx.patch(f"{url}/users/admin", json={"role": "member"}, headers=admin)
    assert stepped.status_code == 200
    assert httpx.get(f"{url}/users", headers=admin).status_code == 403
