"""``--autoscale``: the loop tells a backend whose cluster grows how many slots the jobs
would use, follows the nodes that join, and withdraws the request when the jobs end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.fakes import FakeBackend
from tidal.backends.base import ClusterScaling, DiscoveredHost
from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.cluster_scaling import ClusterRequests
from tidal.controller.loop.controller import Controller
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.requests import Resize
from tidal.model import JobState
from tidal.policy.api import Policy
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.static import StaticPolicy
from tidal.spec import parse_spec


class GrowingBackend(FakeBackend):
    """Reports the hosts the test sets and records what it was asked for; a request
    that fails (``refuse``) raises, as a cluster out of reach would."""

    def __init__(self, hosts: list[DiscoveredHost]) -> None:
        super().__init__()
        self.host_list = hosts
        self.requests: list[int] = []
        self.refuse = False

    def hosts(self) -> list[DiscoveredHost]:
        """The hosts as the test set them."""
        return list(self.host_list)

    def request_slots(self, slots: int) -> None:
        """Record the request (or fail)."""
        if self.refuse:
            raise ConnectionError("GCS unreachable")
        self.requests.append(slots)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path)
    yield s
    s.close()


def _controller(
    store: JobStore,
    tmp_path: Path,
    max_slots: int | None = None,
    policy: Policy | None = None,
) -> tuple[Controller, GrowingBackend]:
    backend = GrowingBackend([DiscoveredHost("n1", 4)])
    assert isinstance(backend, ClusterScaling)
    ctl = Controller(
        store,
        ClusterModel.from_hosts(backend.hosts()),
        policy or FairSharePolicy(),
        backend,
        tmp_path,
        scaling=ClusterRequests(backend, store, max_slots),
    )
    return ctl, backend


def _submit(store: JobStore, name: str, workers: str) -> str:
    spec = parse_spec({"name": name, "command": "python train.py", "workers": workers})
    return store.add_job(spec).id


def test_a_job_wanting_8_on_4_slots_grows_the_cluster_and_the_request_ends_with_it(
    store: JobStore, tmp_path: Path
) -> None:
    ctl, backend = _controller(store, tmp_path)
    a = _submit(store, "a", "1:8")
    ctl.tick()
    assert len(backend.jobs[a].workers) == 4
    assert backend.requests == [8]
    event = next(e for e in store.events() if e.kind == "autoscale")
    assert "8 slot(s): 4 beyond its 4" in event.message

    # Ticks that change nothing ask nothing again.
    ctl.tick()
    assert backend.requests == [8]

    # The autoscaler adds a node: the job grows onto it at once; the want is unchanged.
    backend.host_list = [DiscoveredHost("n1", 4), DiscoveredHost("n2", 4)]
    ctl.tick()
    assert {w.slot[0] for w in backend.jobs[a].workers if w.state.alive} == {"n1", "n2"}
    assert len(backend.alive(a)) == 8
    assert backend.requests == [8]

    # The job ends: the request is withdrawn (the idle node leaves by the cluster's rules).
    backend.finish(a)
    ctl.tick()
    assert store.get_job(a) is not None and store.get_job(a).state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert backend.requests == [8, 0]


def test_a_job_scaled_down_shrinks_the_request(store: JobStore, tmp_path: Path) -> None:
    """`tidal scale` below what the job held: the request follows, so the idle node can go."""
    ctl, backend = _controller(store, tmp_path)
    a = _submit(store, "a", "1:8")
    ctl.tick()
    backend.host_list = [DiscoveredHost("n1", 4), DiscoveredHost("n2", 4)]
    ctl.tick()
    assert backend.requests == [8]
    store.add_request(a, Resize(4, "scale"))
    ctl.tick()
    assert len(backend.alive(a)) == 4
    assert backend.requests == [8, 4]


def test_a_queued_job_too_big_for_the_cluster_asks_for_its_minimum(
    store: JobStore, tmp_path: Path
) -> None:
    """A job whose minimum does not fit is what growing the cluster is for."""
    ctl, backend = _controller(store, tmp_path)
    big = _submit(store, "big", "6:6")
    ctl.tick()
    assert store.get_job(big).state is JobState.QUEUED  # type: ignore[union-attr]
    assert backend.requests == [6]
    backend.host_list = [DiscoveredHost("n1", 4), DiscoveredHost("n2", 4)]
    ctl.tick()
    assert len(backend.alive(big)) == 6


def test_max_slots_caps_the_request(store: JobStore, tmp_path: Path) -> None:
    ctl, backend = _controller(store, tmp_path, max_slots=6)
    _submit(store, "a", "1:8")
    _submit(store, "b", "1:8")
    ctl.tick()
    assert backend.requests == [6]
    assert ctl.scaling is not None and ctl.scaling.last is not None
    assert ctl.scaling.last.capped
    assert "capped by --max-slots 6" in next(
        e.message for e in store.events() if e.kind == "autoscale"
    )


def test_a_failed_request_is_asked_again(store: JobStore, tmp_path: Path) -> None:
    ctl, backend = _controller(store, tmp_path)
    _submit(store, "a", "2:8")
    backend.refuse = True
    ctl.tick()
    assert backend.requests == []
    backend.refuse = False
    ctl.tick()
    assert backend.requests == [8]


def test_a_policy_that_does_not_say_gets_fairshares_rule(store: JobStore, tmp_path: Path) -> None:
    ctl, backend = _controller(store, tmp_path, policy=StaticPolicy())
    _submit(store, "a", "1:8")
    ctl.tick()
    assert backend.requests == [8]


class FailingWants(FairSharePolicy):
    """Allocates like fairshare; fails to say what the jobs want."""

    def slots_wanted(self, jobs: object, cluster: object, previous: object) -> dict[str, int]:
        raise RuntimeError("no idea")


def test_a_policy_failing_to_say_leaves_scheduling_alone(store: JobStore, tmp_path: Path) -> None:
    ctl, backend = _controller(store, tmp_path, policy=FailingWants())
    a = _submit(store, "a", "1:8")
    ctl.tick()
    assert len(backend.alive(a)) == 4
    assert backend.requests == []


def test_max_slots_must_be_positive(store: JobStore) -> None:
    with pytest.raises(ValueError, match="max_slots"):
        ClusterRequests(GrowingBackend([]), store, 0)
