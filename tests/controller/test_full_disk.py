"""A full disk under a real API server and controller loop (the data dir on a real, full
tmpfs): writes are a 507 naming the disk, reads go on, the loop backs off with one warning
instead of a traceback a tick, and everything resumes once space is freed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.controller.fakes import FakeBackend, GreedyPolicy
from tests.tmpfs import fill, mounted_tmpfs
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.server.app import create_app
from tidal.server.process import ApiServer

SPEC = {"name": "train", "command": ["python", "t.py"], "workers": 1}


@dataclass
class FullDisk:
    data: Path
    http: httpx.Client
    backend: FakeBackend
    controller: Controller


def _until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[FullDisk]:
    with mounted_tmpfs(tmp_path / "data") as data:
        token = ensure_token(data)
        store = JobStore.open(data)
        backend = FakeBackend()
        controller = Controller(
            store, ClusterModel.single(2, name="h"), GreedyPolicy(), backend, data
        )
        server = ApiServer(create_app(controller, token))
        server.start()
        controller.start(interval=0.05)
        try:
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as http:
                yield FullDisk(data, http, backend, controller)
        finally:
            controller.stop()
            server.stop()
            store.close()


def _failures(controller: Controller) -> float:
    return float(controller.metrics.tick_failures._value.get())


def test_a_full_disk_is_a_507_and_everything_resumes_after(
    served: FullDisk, caplog: pytest.LogCaptureFixture
) -> None:
    http, data = served.http, served.data
    job = http.post("/jobs", json=SPEC).json()["id"]
    _until(lambda: http.get(f"/jobs/{job}").json()["state"] == "running")

    caplog.set_level(logging.WARNING)
    filler = fill(data)
    # The job ends while the disk is full: the loop cannot record it.
    served.backend.finish(job)
    refused = [
        http.post("/jobs", json=SPEC),
        http.put(f"/jobs/{job}/priority", json={"priority": 7}),
        http.post(f"/jobs/{job}/cancel"),
    ]
    for response in refused:
        assert response.status_code == 507, response.text
        body = response.json()
        assert body["cause"] == "disk full"
        assert body["detail"].startswith(
            f"disk full: no space left on the disk holding {data / 'tidal.db'} "
        ), body
        assert "nothing was recorded" in body["detail"]
    # One line in the server's log for the three, not a traceback each.
    api = [r for r in caplog.records if r.name == "tidal.controller.routes.limits"]
    assert len(api) == 1 and api[0].exc_info is None, [r.getMessage() for r in api]
    assert api[0].getMessage().startswith("a request could not be recorded: disk full: ")
    # Reads go on.
    assert http.get("/health").status_code == 200
    assert [j["id"] for j in http.get("/jobs").json()] == [job]
    assert http.get(f"/jobs/{job}").json()["priority"] != 7
    # The loop fails tick after tick, backing off, and says so once, without a traceback.
    _until(lambda: _failures(served.controller) >= 4)
    assert http.get(f"/jobs/{job}").json()["state"] == "running"
    loop = [r for r in caplog.records if r.name == "tidal.controller.loop.controller"]
    assert len(loop) == 1, [r.getMessage() for r in loop]
    assert loop[0].getMessage().startswith("controller ticks fail (disk full: ")
    assert loop[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    filler.unlink()
    # By itself: the loop records the job's end, and writes are taken again.
    _until(lambda: http.get(f"/jobs/{job}").json()["state"] == "succeeded")
    again = http.post("/jobs", json=SPEC)
    assert again.status_code == 201, again.text
    loop = [r for r in caplog.records if r.name == "tidal.controller.loop.controller"]
    assert len(loop) == 2 and loop[1].getMessage().startswith("controller ticks succeed again")
