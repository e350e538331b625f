"""Draining a host through the API, the CLI and the loop: no new workers there, its jobs
moved off at their next step boundary, a job that cannot leave checkpointed before the
deadline, all kept across a server restart. A real API server over the in-memory backend
(the training itself is in ``tests/controller/test_drain_live.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.controller.conftest import Served
from tests.controller.conftest import serve as serve_controller
from tests.controller.fakes import FakeBackend
from tidal.cli.main import controller_app, run_app
from tidal.client import NotFound
from tidal.controller.cluster import ClusterHost, ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Policy
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.static import StaticPolicy
from tidal.spec import parse_spec

HOSTS = ClusterModel((ClusterHost("node-a", 4), ClusterHost("node-b", 4)))


def serve(tmp_path: Path, policy: Policy) -> AbstractContextManager[Served]:
    """A real API server over ``policy`` and a backend whose jobs apply a change only at
    their next step boundary (``advance``); stopped and its store closed after."""
    return serve_controller(tmp_path, HOSTS, policy, FakeBackend(instant=False))


@pytest.fixture
def elastic(tmp_path: Path) -> Iterator[Served]:
    with serve(tmp_path, FairSharePolicy()) as served:
        yield served


def hosts_of(slots: tuple[tuple[str, int], ...]) -> set[str]:
    return {h for h, _ in slots}


def test_a_drained_host_is_left_at_the_next_step_boundary_and_shown_until_empty(
    elastic: Served,
) -> None:
    client, ctl, backend = elastic.client(), elastic.controller, elastic.backend
    job = elastic.store.add_job(parse_spec({"name": "e", "command": "x", "workers": "2:6"}))
    ctl.tick()
    backend.advance()
    ctl.tick()
    before = elastic.store.get_job(job.id)
    assert before is not None and len(before.slots) == 6
    assert hosts_of(before.slots) == {"node-a", "node-b"}

    view = client.drain("node-a", deadline=30)
    assert view.draining is not None and view.draining.source == "admin"
    assert view.draining.leaves_at is not None
    assert 0 < view.draining.leaves_at - time.time() <= 30
    ctl.tick()
    after = elastic.store.get_job(job.id)
    assert after is not None
    assert hosts_of(after.slots) == {"node-b"}  # asked off node-a, never given more of it
    # Until the job reaches its step boundary its workers are still on the host.
    host = next(h for h in client.cluster().hosts if h.name == "node-a")
    assert host.draining is not None and host.draining.remaining == [job.id]
    backend.advance()
    ctl.tick()
    host = next(h for h in client.cluster().hosts if h.name == "node-a")
    assert host.draining is not None and host.draining.remaining == []
    assert host.draining.checkpoints == []
    # No checkpoint and no restart: the job was only told its new slots.
    assert next(c for c in backend.calls if c[1] == job.id)[0] == "start"
    assert sum(1 for c in backend.calls if c[0] == "start") == 1
    assert "drain" in [e.kind for e in client.events()]

    client.undrain("node-a")
    ctl.tick()
    backend.advance()
    ctl.tick()
    back = elastic.store.get_job(job.id)
    assert back is not None and len(back.slots) == 6
    assert next(h for h in client.cluster().hosts if h.name == "node-a").draining is None


def test_an_unknown_host_is_refused_by_name(elastic: Served) -> None:
    with pytest.raises(NotFound, match=r"no host 'node-z'.*node-a, node-b"):
        elastic.client().drain("node-z")
    with pytest.raises(NotFound, match="node-z"):
        elastic.client().preemption_notice("node-z", time.time() + 30)


def test_a_preemption_notice_drains_and_may_only_bring_the_time_forward(
    elastic: Served,
) -> None:
    client = elastic.client()
    soon = time.time() + 30
    view = client.preemption_notice("node-b", soon)
    assert view.draining is not None and view.draining.source == "notice"
    assert view.draining.leaves_at == pytest.approx(soon)
    later = client.preemption_notice("node-b", soon + 60)
    assert later.draining is not None and later.draining.leaves_at == pytest.approx(soon)


def test_a_fixed_job_with_no_room_elsewhere_checkpoints_before_the_deadline(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, StaticPolicy()) as served:
        client, ctl, backend = served.client(), served.controller, served.backend
        fixed = served.store.add_job(parse_spec({"name": "f", "command": "x", "workers": 4}))
        other = served.store.add_job(parse_spec({"name": "o", "command": "x", "workers": 4}))
        ctl.tick()
        backend.advance()
        ctl.tick()
        held = served.store.get_job(fixed.id)
        assert held is not None
        host = next(iter(hosts_of(held.slots)))

        client.drain(host, deadline=20)  # inside the checkpoint lead: at once
        ctl.tick()
        events = [e for e in client.events(fixed.id) if e.kind == "drain-checkpoint"]
        assert len(events) == 1 and events[0].data["host"] == host
        # No slots is a preemption: the backend writes a durable checkpoint and waits.
        assert ("assign", fixed.id, 0) in backend.calls
        view = next(h for h in client.cluster().hosts if h.name == host)
        assert view.draining is not None
        assert [c.job for c in view.draining.checkpoints] == [fixed.id]
        other_job = served.store.get_job(other.id)
        assert other_job is not None and len(other_job.slots) == 4

        # Room appears (the other job ends): the fixed job resumes off the drained host.
        client.cancel(other.id)
        for _ in range(4):
            ctl.tick()
            backend.advance()
        resumed = served.store.get_job(fixed.id)
        assert resumed is not None and len(resumed.slots) == 4
        assert host not in hosts_of(resumed.slots)


def test_a_drain_survives_a_server_restart(tmp_path: Path) -> None:
    with serve(tmp_path, FairSharePolicy()) as first:
        first.client().drain("node-a")
    with serve(tmp_path, FairSharePolicy()) as second:
        job = second.store.add_job(parse_spec({"name": "e", "command": "x", "workers": "1:8"}))
        second.controller.tick()
        got = second.store.get_job(job.id)
        assert got is not None and hosts_of(got.slots) == {"node-b"}
        assert second.client().undrain("node-a").draining is None


def test_the_cli_drains_and_undrains_and_the_cluster_listing_says_so(
    elastic: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--url", elastic.url, "--token", elastic.token]

    def run(*argv: str) -> tuple[int, str]:
        code = run_app(controller_app, [*argv, *where])
        out, err = capsys.readouterr()
        return code, out + err

    code, out = run("drain", "node-a", "--deadline", "2m")
    assert code == 0 and "node-a: draining" in out
    drain = next(h for h in elastic.client().cluster().hosts if h.name == "node-a").draining
    assert drain is not None and drain.leaves_at is not None
    assert 100 < drain.leaves_at - time.time() <= 120
    code, out = run("cluster")
    assert "node-a (draining)" in out
    assert "node-a: draining (admin, goes in" in out
    code, out = run("drain", "node-a", "--deadline", "soon")
    assert code != 0 and "--deadline" in out
    code, out = run("undrain", "node-a")
    assert code == 0 and "node-a: in service" in out


class NoticedBackend(FakeBackend):
    """The in-memory backend, with a platform that drains hosts (as Ray's drain notice)."""

    def __init__(self) -> None:
        super().__init__()
        self.notices: dict[str, float | None] = {}

    def leaving(self) -> dict[str, float | None]:
        return dict(self.notices)


def test_a_backends_drain_notice_drains_the_host_once(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path)
    try:
        backend = NoticedBackend()
        ctl = Controller(store, HOSTS, FairSharePolicy(), backend, tmp_path)
        job = store.add_job(parse_spec({"name": "e", "command": "x", "workers": "1:8"}))
        ctl.tick()
        backend.notices = {"node-a": 2_000_000_000.0, "gone": None}
        ctl.tick()
        ctl.tick()
        drains = store.drains()
        assert list(drains) == ["node-a"]
        assert drains["node-a"].source.value == "ray"
        assert drains["node-a"].leaves_at == 2_000_000_000.0
        assert [e.kind for e in store.events()].count("drain") == 1
        got = store.get_job(job.id)
        assert got is not None and hosts_of(got.slots) == {"node-b"}
    finally:
        store.close()
