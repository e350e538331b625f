"""Users manage their own tokens, and admins change users' roles and teams, through the
real API on a real server and store: a member creates, lists and revokes their own tokens
and cannot touch another user's; a demoted user's next change is refused; the last admin
keeps the role; a bad change names its field and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.controller.account_scene import Scene, open_scene
from tests.controller.fakes import GreedyPolicy
from tests.controller.test_migrations import dump
from tidal.policy.team_queues import TeamQueues
from tidal.policy.teams import Team


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with open_scene(tmp_path) as opened:
        yield opened


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


def test_with_a_teams_file_a_user_joins_only_its_teams(tmp_path: Path) -> None:
    teams = TeamQueues(GreedyPolicy(), [Team("vision"), Team("nlp")])
    with open_scene(tmp_path, teams) as scene:
        admin = scene.as_("admin")
        before = dump(scene.store.engine)
        for method, path, body in [
            ("PATCH", "/users/ana", {"team": "visoin"}),
            ("POST", "/users", {"name": "eve", "team": "visoin"}),
        ]:
            refused = httpx.request(method, f"{scene.url}{path}", json=body, headers=admin)
            assert refused.status_code == 422, (method, path, refused.text)
            problem = refused.json()["detail"][0]
            assert problem["loc"] == ["body", "team"]
            assert "'visoin' is not a team of this server" in problem["msg"]
            assert "default, nlp, vision" in problem["msg"]
        assert dump(scene.store.engine) == before
        moved = httpx.patch(f"{scene.url}/users/ana", json={"team": "nlp"}, headers=admin)
        assert moved.status_code == 200, moved.text
