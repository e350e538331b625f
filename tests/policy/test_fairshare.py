"""fairshare: the worked example, admission, placement and proportionality properties."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.policy.api import Cluster, Host, JobRequest, Slot
from tidal.policy.fairshare import FairSharePolicy, proportional_shares

from .strategies import assert_valid, clusters, job_lists

ONE_HOST = Cluster((Host("h0", 8),))


def counts(allocation: dict[str, tuple[tuple[str, int], ...]]) -> dict[str, int]:
    return {job: len(slots) for job, slots in allocation.items()}


def test_worked_example_on_one_host_of_eight() -> None:
    policy = FairSharePolicy()
    first = JobRequest("a", 1, 8, submitted_at=0)
    second = JobRequest("b", 1, 8, submitted_at=1)
    alloc = policy.allocate([first], ONE_HOST, {})
    assert counts(alloc) == {"a": 8}
    alloc = policy.allocate([first, second], ONE_HOST, alloc)
    assert counts(alloc) == {"a": 4, "b": 4}
    raised = JobRequest("b", 1, 8, priority=10000, submitted_at=1)
    shrunk = policy.allocate([first, raised], ONE_HOST, alloc)
    assert counts(shrunk) == {"a": 3, "b": 5}
    # The shrinking job keeps a subset of its slots, the growing one keeps all of its own.
    assert set(shrunk["a"]) < set(alloc["a"])
    assert set(shrunk["b"]) > set(alloc["b"])
    alloc = policy.allocate([raised], ONE_HOST, shrunk)
    assert counts(alloc) == {"b": 8}


def test_repeated_decision_moves_nothing() -> None:
    policy = FairSharePolicy()
    jobs = [JobRequest(f"j{i}", 1, 8, submitted_at=i) for i in range(3)]
    first = policy.allocate(jobs, ONE_HOST, {})
    assert sorted(counts(first).values()) == [2, 3, 3]
    assert policy.allocate(jobs, ONE_HOST, first) == first


def test_rounding_noise_does_not_move_a_slot() -> None:
    # Shares 2.6 / 2.7 / 2.7 of 8: plain largest remainder would take the extra slot from
    # "a" (which holds 3) and give it to "c"; hysteresis keeps the current holders.
    policy = FairSharePolicy()
    jobs = [
        JobRequest("a", 1, 8, priority=4800, submitted_at=0),
        JobRequest("b", 1, 8, priority=5000, submitted_at=1),
        JobRequest("c", 1, 8, priority=5000, submitted_at=2),
    ]
    held: dict[str, tuple[Slot, ...]] = {
        "a": (("h0", 0), ("h0", 1), ("h0", 2)),
        "b": (("h0", 3), ("h0", 4), ("h0", 5)),
    }
    held["c"] = (("h0", 6), ("h0", 7))
    assert policy.allocate(jobs, ONE_HOST, held) == held
    # Without a history the larger remainders win.
    assert counts(policy.allocate(jobs, ONE_HOST, {})) == {"a": 2, "b": 3, "c": 3}


def test_newcomer_shrinks_elastic_jobs_to_their_minimum_before_queueing() -> None:
    policy = FairSharePolicy()
    running = JobRequest("a", 2, 8, submitted_at=0)
    alloc = policy.allocate([running], ONE_HOST, {})
    big = JobRequest("b", 6, 8, submitted_at=1)
    alloc = policy.allocate([running, big], ONE_HOST, alloc)
    assert counts(alloc) == {"a": 2, "b": 6}
    late = JobRequest("c", 1, 8, submitted_at=2)
    assert "c" not in policy.allocate([running, big, late], ONE_HOST, alloc)


def test_queue_is_served_in_priority_then_submission_order() -> None:
    policy = FairSharePolicy()
    jobs = [
        JobRequest("early", 4, 8, submitted_at=0),
        JobRequest("late-important", 4, 8, priority=9000, submitted_at=5),
        JobRequest("later", 4, 8, submitted_at=6),
    ]
    assert set(policy.allocate(jobs, ONE_HOST, {})) == {"early", "late-important"}
    # Strict queue: a small job does not overtake a blocked one ahead of it.
    blocked = [JobRequest("big", 9, 9, submitted_at=0), JobRequest("small", 1, 1, submitted_at=1)]
    assert policy.allocate(blocked, ONE_HOST, {}) == {}


def test_target_slots_caps_the_share() -> None:
    policy = FairSharePolicy()
    jobs = [
        JobRequest("a", 1, 8, target_slots=2, submitted_at=0),
        JobRequest("b", 1, 8, submitted_at=1),
    ]
    assert counts(policy.allocate(jobs, ONE_HOST, {})) == {"a": 2, "b": 6}


def test_packs_a_job_on_few_hosts_and_honours_groups() -> None:
    cluster = Cluster(
        (
            Host("a0", 4, group="a"),
            Host("a1", 4, group="a"),
            Host("b0", 4, group="b"),
            Host("b1", 4, group="b"),
        )
    )
    jobs = [
        JobRequest("ga", 1, 8, group="a", submitted_at=0),
        JobRequest("gb", 1, 3, group="b", submitted_at=1),
    ]
    alloc = FairSharePolicy().allocate(jobs, cluster, {})
    assert {host for host, _ in alloc["ga"]} == {"a0", "a1"}
    assert {host for host, _ in alloc["gb"]} == {"b0"}


def test_shrinking_drops_slots_where_the_job_has_fewest() -> None:
    cluster = Cluster((Host("h0", 4), Host("h1", 4)))
    held = {"a": (("h0", 0), ("h0", 1), ("h0", 2), ("h1", 0))}
    jobs = [JobRequest("a", 1, 3, submitted_at=0)]
    assert FairSharePolicy().allocate(jobs, cluster, held) == {
        "a": (("h0", 0), ("h0", 1), ("h0", 2))
    }


@settings(max_examples=150, deadline=None)
@given(jobs=job_lists(), cluster=clusters())
def test_properties(jobs: list[JobRequest], cluster: Cluster) -> None:
    policy = FairSharePolicy()
    alloc = policy.allocate(jobs, cluster, {})
    assert_valid(alloc, cluster)
    by_id = {j.job_id: j for j in jobs}
    for job_id, slots in alloc.items():
        job = by_id[job_id]
        cap = job.target_slots if job.target_slots is not None else job.max_slots
        assert job.min_slots <= len(slots) <= cap
    # Deterministic, and stable when replayed with its own result as history.
    assert policy.allocate(list(reversed(jobs)), cluster, {}) == alloc
    assert counts(policy.allocate(jobs, cluster, alloc)) == counts(alloc)
    # Work-conserving: slots stay idle only when every admitted job is at its cap.
    used = sum(len(s) for s in alloc.values())
    if used < cluster.total_slots:
        for job_id, slots in alloc.items():
            job = by_id[job_id]
            cap = job.target_slots if job.target_slots is not None else job.max_slots
            assert len(slots) == cap


@settings(max_examples=150, deadline=None)
@given(
    priorities=st.lists(st.sampled_from([1000, 2000, 5000, 7000, 10000]), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6),
)
def test_within_one_slot_of_proportional_without_clipping(
    priorities: list[int], sizes: list[int]
) -> None:
    cluster = Cluster(tuple(Host(f"h{i}", n) for i, n in enumerate(sizes)))
    total = cluster.total_slots
    jobs = [
        JobRequest(f"j{i}", 1, total, priority=p, submitted_at=i) for i, p in enumerate(priorities)
    ]
    weight = sum(priorities)
    ideal = {j.job_id: total * j.priority / weight for j in jobs}
    if any(share < 1 for share in ideal.values()):
        return  # a minimum would clip
    alloc = FairSharePolicy().allocate(jobs, cluster, {})
    assert sum(len(s) for s in alloc.values()) == total
    for job_id, share in ideal.items():
        assert abs(len(alloc[job_id]) - share) < 1
        assert len(alloc[job_id]) in (math.floor(share), math.ceil(share))


def test_water_filling_redistributes_clipped_slack() -> None:
    jobs = [
        JobRequest("small", 1, 2, submitted_at=0),
        JobRequest("x", 1, 20),
        JobRequest("y", 1, 20),
    ]
    shares = proportional_shares(jobs, 12)
    assert shares == {"small": 2.0, "x": 5.0, "y": 5.0}


def test_simulator_replays_the_controllers_fairshare() -> None:
    import tidal.policy.fairshare as controller_module
    from tidal.policy.registry import simulated_policy

    policy = simulated_policy("fairshare", reallocation_cost=30.0)
    assert type(policy) is controller_module.FairSharePolicy
    assert type(policy).allocate is controller_module.FairSharePolicy.allocate


@settings(max_examples=100, deadline=None)
@given(
    host_groups=st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=6),
    job_groups=st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=8),
    held_first=st.booleans(),
)
def test_groups_are_honoured(
    host_groups: list[str | None], job_groups: list[str | None], held_first: bool
) -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4, group=g) for i, g in enumerate(host_groups)))
    group_of = {h.name: h.group for h in cluster.hosts}
    jobs = [JobRequest(f"j{i}", 1, 6, group=g, submitted_at=i) for i, g in enumerate(job_groups)]
    policy = FairSharePolicy()
    # Replaying a previous decision with the groups' jobs swapped around exercises eviction.
    previous = policy.allocate(list(reversed(jobs)), cluster, {}) if held_first else {}
    alloc = policy.allocate(jobs, cluster, previous)
    assert_valid(alloc, cluster)
    for job in jobs:
        slots = alloc.get(job.job_id, ())
        if job.group is not None:
            assert all(group_of[host] == job.group for host, _ in slots)
        assert not slots or 1 <= len(slots) <= 6
