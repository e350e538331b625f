"""A data dir of the release before users: its one admin token and its store open as the
user ``admin``'s token and jobs, nothing lost; a fresh data dir works as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from alembic import command
from sqlalchemy import create_engine

from tests.controller.fakes import FakeBackend, GreedyPolicy
from tests.controller.test_migrations import RELEASES, copy_release_into, dump
from tidal.controller.cluster import ClusterModel
from tidal.controller.credentials import KEY_FILE, ServerKey
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store import migrations
from tidal.controller.store.jobs import JobStore
from tidal.server.app import create_app
from tidal.server.process import ApiServer


def serve_once(data_dir: Path, token: str) -> dict[str, Any]:
    """Start a server on the data dir as ``tidal server`` does, read what a user sees
    with ``token``, stop it."""
    key = ServerKey.in_data_dir(data_dir)
    store = JobStore.open(data_dir)
    controller = Controller(
        store, ClusterModel.single(4, name="h"), GreedyPolicy(), FakeBackend(), data_dir
    )
    server = ApiServer(create_app(controller, token, key))
    server.start()
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
            return {
                "me": http.get("/me").json(),
                "jobs": http.get("/jobs").json(),
                "tokens": http.get("/tokens").json(),
                "users": http.get("/users").json(),
            }
    finally:
        server.stop()
        store.close()


def test_a_data_dir_of_the_previous_release_opens_with_its_token_as_the_admins(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    url = f"sqlite:///{data_dir / 'tidal.db'}"
    # The previous release's store: the release fixture brought to revision 0009.
    copy_release_into(RELEASES[2], url, 2)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.stamp(migrations.config(conn), "0001")
            command.upgrade(migrations.config(conn), "0009")
        before = dump(engine)
    finally:
        engine.dispose()
    token = ensure_token(data_dir)  # the one admin token that release wrote
    assert not (data_dir / KEY_FILE).exists()

    seen = serve_once(data_dir, token)
    assert seen["me"] == {**seen["me"], "name": "admin", "role": "admin", "team": "default"}
    jobs = seen["jobs"]
    assert isinstance(jobs, list)
    assert sorted(j["id"] for j in jobs) == sorted(r["id"] for r in before["jobs"])
    assert {(j["owner"], j["team"]) for j in jobs} == {("admin", "default")}
    tokens = seen["tokens"]
    assert isinstance(tokens, list)
    assert [(t["user"], t["name"], t["revoked_at"]) for t in tokens] == [
        ("admin", "data-dir", None)
    ]
    assert (data_dir / KEY_FILE).stat().st_mode & 0o777 == 0o600

    # A second start registers nothing more, and the store lost nothing.
    again = serve_once(data_dir, token)
    assert again["tokens"] == tokens
    engine = create_engine(url)
    try:
        after = dump(engine)
    finally:
        engine.dispose()
    for table in ("jobs", "workers", "allocations", "metrics", "goodput"):
        assert len(after[table]) == len(before[table]), table
    assert len(after["events"]) == len(before["events"])


def test_a_first_start_makes_the_admin_with_the_data_dirs_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    token = ensure_token(data_dir)
    seen = serve_once(data_dir, token)
    assert seen["users"] == [{**seen["me"]}]
    assert seen["me"] == {**seen["me"], "name": "admin", "role": "admin"}
