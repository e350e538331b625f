"""A real API server on 127.0.0.1:0 over a controller with the fake backend; databases for
the store tests (SQLite and a private PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.controller.fakes import FakeBackend, GreedyPolicy
from tests.controller.postgres import Postgres, running_postgres
from tidal.client import Client
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Policy
from tidal.server.app import create_app
from tidal.server.process import ApiServer


@dataclass
class Served:
    """A running API server and what it runs on."""

    url: str
    token: str
    data_dir: Path
    store: JobStore
    backend: FakeBackend
    controller: Controller

    def client(self, **kw: object) -> Client:
        """An SDK client with the admin token. Its timeout is generous: the server runs in
        this test process's threads, which a loaded machine can starve for seconds."""
        return Client(url=self.url, token=self.token, timeout=30.0, **kw)  # type: ignore[arg-type]


@contextmanager
def serve(
    tmp_path: Path, cluster: ClusterModel, policy: Policy, backend: FakeBackend | None = None
) -> Iterator[Served]:
    """A real API server over a controller of ``cluster``, ``policy`` and ``backend`` (by
    default a fake whose jobs apply every change at once); stopped, and its store closed,
    after."""
    data_dir = tmp_path / "data"
    token = ensure_token(data_dir)
    store = JobStore.open(data_dir)
    backend = backend if backend is not None else FakeBackend()
    controller = Controller(store, cluster, policy, backend, data_dir)
    server = ApiServer(create_app(controller, token))
    server.start()
    try:
        yield Served(server.url, token, data_dir, store, backend, controller)
    finally:
        server.stop()
        store.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The server, stopped (and its store closed) after the test."""
    with serve(tmp_path, ClusterModel.single(4, name="h"), GreedyPolicy()) as running:
        yield running


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Postgres]:
    """A private PostgreSQL server shared by the session's tests (skipped where absent)."""
    with running_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database: a SQLite file, then a database on the private PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tidal.db'}"
    server: Postgres = request.getfixturevalue("postgres_server")
    return server.new_database()
