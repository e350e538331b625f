"""What ``--autoscale`` asks the backend for: bundles of each replica's width with the
node labels its job needs, to a backend that takes shapes; the slot count otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tidal.controller.loop.cluster_scaling import ClusterRequests, node_labels
from tidal.controller.resource_groups import ClusterConfig, GroupConfig
from tidal.controller.store.jobs import JobStore
from tidal.model import Placement
from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.autoscale import SlotBundle
from tidal.policy.fairshare import FairSharePolicy

CLUSTER = Cluster((Host("h0", 4),))
GROUPS = ClusterConfig(
    groups=[
        GroupConfig(name="a100", labels={"gpu": "a100"}),
        GroupConfig(name="build", hosts=["build-*"]),
    ]
)


class ShapedCluster:
    """A cluster that is asked for room by shape (a backend plugin's side)."""

    def __init__(self) -> None:
        self.asked: list[tuple[SlotBundle, ...]] = []

    def request_slots(self, slots: int) -> None:
        raise AssertionError("a backend that takes bundles is asked for bundles")

    def request_bundles(self, bundles: Sequence[SlotBundle]) -> None:
        self.asked.append(tuple(bundles))


class CountedCluster:
    """A cluster asked for a number of slots only."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def request_slots(self, slots: int) -> None:
        self.asked.append(slots)


def test_node_labels_are_the_group_labels_and_the_jobs_own() -> None:
    assert node_labels(Placement("a100", {"zone": "b"}), GROUPS) == {"gpu": "a100", "zone": "b"}
    # A group that picks hosts by name names no node that does not exist yet.
    assert node_labels(Placement("build"), GROUPS) == {}
    assert node_labels(Placement(None, {"zone": "b"}), None) == {"zone": "b"}


def test_wide_and_labelled_jobs_are_asked_for_by_shape(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'tidal.db'}")
    try:
        backend = ShapedCluster()
        requests = ClusterRequests(backend, store, max_slots=16)
        wide = JobRequest(
            "wide", min_slots=2, max_slots=8, replica_slots=2, group="a100", submitted_at=1.0
        )
        plain = JobRequest("plain", min_slots=1, max_slots=2, submitted_at=2.0)
        held = {"wide": (("h0", 0), ("h0", 1)), "plain": (("h0", 2),)}
        labels = {"wide": node_labels(Placement("a100"), GROUPS)}
        policy = FairSharePolicy()
        requests.update(policy, [wide, plain], CLUSTER, held, labels)
        a100 = {"gpu": "a100"}
        assert backend.asked == [(SlotBundle(2, a100),) * 4 + (SlotBundle(1),) * 2]
        # Asked again only when the shape changes, not each tick.
        requests.update(policy, [wide, plain], CLUSTER, held, labels)
        assert len(backend.asked) == 1
        (event,) = [e for e in store.events() if e.kind == "autoscale"]
        assert event.data["by_job"] == {"wide": 8, "plain": 2}
        assert event.data["bundles"] == [
            {"slots": 1, "labels": {}, "count": 2},
            {"slots": 2, "labels": a100, "count": 4},
        ]
        assert (event.data["wanted_slots"], event.data["extra_slots"]) == (10, 6)
    finally:
        store.close()


def test_a_backend_of_slots_only_is_asked_for_their_number(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'tidal.db'}")
    try:
        backend = CountedCluster()
        requests = ClusterRequests(backend, store)
        wide = JobRequest("wide", min_slots=2, max_slots=8, replica_slots=2)
        requests.update(FairSharePolicy(), [wide], CLUSTER, {"wide": (("h0", 0), ("h0", 1))})
        assert backend.asked == [8]
    finally:
        store.close()


def test_under_the_cap_the_queue_order_keeps_its_bundles(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'tidal.db'}")
    try:
        backend = ShapedCluster()
        requests = ClusterRequests(backend, store, max_slots=5)
        early = JobRequest("early", min_slots=2, max_slots=4, submitted_at=1.0)
        urgent = JobRequest("urgent", min_slots=4, max_slots=4, priority=9000, submitted_at=2.0)
        held = {"early": (("h0", 0), ("h0", 1))}
        decision = requests.update(FairSharePolicy(), [early, urgent], CLUSTER, held)
        # The later job of higher priority is asked for whole (4), the first gets what is left.
        assert decision is not None and decision.capped
        assert backend.asked == [(SlotBundle(1),) * 5]
        assert list(decision.by_job) == ["urgent", "early"]
    finally:
        store.close()
