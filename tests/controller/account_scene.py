"""A live server with users of each role and tokens of each kind, for the tests of who
may do what through the real API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from tests.controller.fakes import FakeBackend, GreedyPolicy
from tidal.controller.cluster import ClusterModel
from tidal.controller.credentials import ServerKey
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Policy
from tidal.server.app import create_app
from tidal.server.process import ApiServer

SPEC = {"name": "train", "command": "python train.py", "workers": "1:4"}


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


def post_created(url: str, path: str, token: str, body: Any) -> dict[str, Any]:
    """POST ``body`` as ``token``'s user; the answer, which must be 201."""
    response = httpx.post(
        f"{url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert response.status_code == 201, response.text
    found: dict[str, Any] = response.json()
    return found


@contextmanager
def open_scene(tmp_path: Path, policy: Policy | None = None) -> Iterator[Scene]:
    """The scene's server on 127.0.0.1 (``policy``: the greedy one by default), stopped
    with its store at the end."""
    data_dir = tmp_path / "data"
    admin = ensure_token(data_dir)
    key = ServerKey.in_data_dir(data_dir)
    store = JobStore.open(data_dir)
    controller = Controller(
        store, ClusterModel.single(4, name="h"), policy or GreedyPolicy(), FakeBackend(), data_dir
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
            post_created(url, "/users", admin, {"name": name, "role": role, "team": team})
            tokens[name] = post_created(url, "/tokens", admin, {"name": "laptop", "user": name})[
                "token"
            ]
        tokens["revoked"] = post_created(url, "/tokens", admin, {"name": "old", "user": "ana"})[
            "token"
        ]
        revoked = httpx.post(
            f"{url}/tokens/ana/old/revoke", headers={"Authorization": f"Bearer {admin}"}
        )
        assert revoked.status_code == 200
        # Expired a second ago: written into the store as the server would have.
        tokens["expired"] = "an-expired-token-of-ana"
        store.add_token("ana", "expired", key.digest(tokens["expired"]), expires_at=time.time() - 1)
        job = post_created(url, "/jobs", tokens["ana"], SPEC)["id"]
        yield Scene(url, app, store, key, tokens, job)
    finally:
        server.stop()
        store.close()
