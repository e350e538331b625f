"""How many slots the jobs would use (``--autoscale``): the decision's properties over
random jobs, and each policy's rule on cases worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.policy.strategies import clusters, job_lists
from tidal.policy.api import Allocation, Cluster, Host, JobRequest, ThroughputModel
from tidal.policy.autoscale import (
    BundleShape,
    ScalingPolicy,
    SlotBundle,
    bundles_for,
    efficient_slots,
    fairshare_wants,
    scale_decision,
)
from tidal.policy.budget import slot_cap
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.goodput import GoodputPolicy, live_policy

CLUSTER = Cluster((Host("h0", 4),))


def _holding(jobs: list[JobRequest], running: list[bool], cluster: Cluster) -> Allocation:
    """An allocation where the jobs flagged ``running`` hold their minimum (slots need not
    exist: only the counts matter to the wants)."""
    return {
        job.job_id: tuple(("h0", i) for i in range(max(1, job.min_slots)))
        for job, flag in zip(jobs, running, strict=False)
        if flag
    }


@st.composite
def jobs_and_holdings(draw: st.DrawFn) -> tuple[list[JobRequest], Allocation, Cluster]:
    jobs = draw(job_lists())
    running = draw(st.lists(st.booleans(), min_size=len(jobs), max_size=len(jobs)))
    cluster = draw(clusters())
    return jobs, _holding(jobs, running, cluster), cluster


POLICIES = [FairSharePolicy(), live_policy(), GoodputPolicy()]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}")
@settings(max_examples=60, deadline=None)
@given(case=jobs_and_holdings(), cap=st.one_of(st.none(), st.integers(0, 40)))
def test_never_above_the_cap(
    policy: ScalingPolicy, case: tuple[list[JobRequest], Allocation, Cluster], cap: int | None
) -> None:
    jobs, previous, cluster = case
    decision = scale_decision(policy.slots_wanted(jobs, cluster, previous), cluster, cap)
    if cap is not None:
        assert decision.wanted_slots <= cap
    assert 0 <= decision.extra_slots <= decision.wanted_slots
    # Nobody wants more than its cap nor less than it can run on.
    for job in jobs:
        want = decision.by_job[job.job_id]
        assert min(job.min_slots, slot_cap(job)) <= want <= slot_cap(job)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}")
@settings(max_examples=60, deadline=None)
@given(case=jobs_and_holdings(), more=job_lists(max_jobs=3), grow=st.integers(0, 8))
def test_monotone_in_demand(
    policy: ScalingPolicy,
    case: tuple[list[JobRequest], Allocation, Cluster],
    more: list[JobRequest],
    grow: int,
) -> None:
    """More jobs, or a job with a higher maximum, never want fewer slots."""
    jobs, previous, cluster = case
    before = scale_decision(policy.slots_wanted(jobs, cluster, previous), cluster)
    extra = [replace(j, job_id=f"more-{j.job_id}") for j in more]
    added = scale_decision(policy.slots_wanted([*jobs, *extra], cluster, previous), cluster)
    assert added.wanted_slots >= before.wanted_slots
    wider = [replace(j, max_slots=j.max_slots + grow) for j in jobs]
    widened = scale_decision(policy.slots_wanted(wider, cluster, previous), cluster)
    assert widened.wanted_slots >= before.wanted_slots


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}")
@settings(max_examples=60, deadline=None)
@given(jobs=job_lists(), cap=st.one_of(st.none(), st.integers(0, 40)))
def test_nothing_extra_when_nothing_waits_and_all_are_at_max(
    policy: ScalingPolicy, jobs: list[JobRequest], cap: int | None
) -> None:
    """Every job runs at its cap on a cluster that holds them: nothing more is asked."""
    sizes = [slot_cap(j) for j in jobs]
    cluster = Cluster(tuple(Host(f"h{i}", n) for i, n in enumerate(sizes) if n > 0))
    previous = {
        j.job_id: tuple((f"h{i}", k) for k in range(n))
        for i, (j, n) in enumerate(zip(jobs, sizes, strict=True))
        if n > 0
    }
    decision = scale_decision(policy.slots_wanted(jobs, cluster, previous), cluster, cap)
    assert decision.extra_slots == 0


def test_fairshare_running_jobs_grow_to_their_cap_and_queued_ones_start_at_min() -> None:
    running = JobRequest("a", min_slots=2, max_slots=8)
    pinned = JobRequest("b", min_slots=1, max_slots=8, target_slots=3)
    queued = JobRequest("c", min_slots=4, max_slots=8)
    previous = {"a": (("h0", 0), ("h0", 1)), "b": (("h0", 2),)}
    assert fairshare_wants([running, pinned, queued], previous) == {"a": 8, "b": 3, "c": 4}
    decision = scale_decision(
        FairSharePolicy().slots_wanted([running, pinned, queued], CLUSTER, previous), CLUSTER
    )
    assert (decision.wanted_slots, decision.cluster_slots, decision.extra_slots) == (15, 4, 11)
    capped = scale_decision(decision.by_job, CLUSTER, max_slots=12)
    assert (capped.wanted_slots, capped.extra_slots, capped.capped) == (12, 8, True)


def test_a_job_that_wants_8_on_a_4_slot_cluster_asks_for_4_more() -> None:
    job = JobRequest("a", min_slots=1, max_slots=8)
    previous = {"a": tuple(("h0", i) for i in range(4))}
    decision = scale_decision(FairSharePolicy().slots_wanted([job], CLUSTER, previous), CLUSTER)
    assert decision.extra_slots == 4
    # Once it ends nothing is wanted: the request shrinks to zero.
    assert (
        scale_decision(FairSharePolicy().slots_wanted([], CLUSTER, {}), CLUSTER).wanted_slots == 0
    )


def test_efficient_slots_takes_the_largest_size_that_pays() -> None:
    # Per slot: 1.0, 0.9, 0.8, 0.3 (a node boundary), 0.6 — threshold 0.5 keeps size 5.
    table = [0.0, 1.0, 1.8, 2.4, 1.2, 3.0]
    assert efficient_slots(table, floor=1, threshold=0.5) == 5
    assert efficient_slots(table, floor=1, threshold=0.7) == 3
    assert efficient_slots(table, floor=1, threshold=1.0) == 1
    assert efficient_slots(table, floor=5, threshold=0.5) == 5
    with pytest.raises(ValueError, match="threshold"):
        efficient_slots(table, floor=1, threshold=0.0)


def _model(sync: float) -> ThroughputModel:
    """One-sample batches of 1 s of compute and ``sync`` seconds of sync per step."""
    return ThroughputModel(
        alpha_compute=1.0,
        beta_compute=0.0,
        alpha_sync_local=sync,
        beta_sync_local=0.0,
        alpha_sync_node=sync,
        beta_sync_node=0.0,
        grad_noise_scale=float("inf"),
        init_batch_size=1,
        max_local_batch=1,
        max_global_batch=1 << 20,
    )


def test_goodput_asks_for_slots_only_while_they_speed_the_job_up() -> None:
    """A job that scales well wants its maximum; one whose sync dwarfs its compute stops
    where its goodput per slot falls under the threshold."""
    cluster = Cluster((Host("h0", 4), Host("h1", 4)))
    scales = JobRequest("good", min_slots=1, max_slots=16, throughput=_model(0.01))
    # Step at w >= 2 is 1 + 3 = 4 s for w samples: goodput w/4, per slot 1/4 of one slot's.
    poor = JobRequest("poor", min_slots=1, max_slots=16, throughput=_model(3.0))
    policy = GoodputPolicy(speedup_threshold=0.5)
    wants = policy.slots_wanted([scales, poor], cluster, {})
    assert wants == {"good": 16, "poor": 1}
    loose = GoodputPolicy(speedup_threshold=0.2).slots_wanted([poor], cluster, {})
    assert loose == {"poor": 16}
    # Without a model (and no prior) nothing is known: the minimum.
    blind = JobRequest("blind", min_slots=2, max_slots=16)
    assert GoodputPolicy().slots_wanted([blind], cluster, {}) == {"blind": 2}
    # The live policy assumes near-linear scaling until the job reports.
    assert live_policy().slots_wanted([blind], cluster, {}) == {"blind": 16}
    with pytest.raises(ValueError, match="speedup_threshold"):
        GoodputPolicy(speedup_threshold=1.5)


def test_workers_of_several_slots_are_asked_for_as_bundles_of_their_width() -> None:
    """A job of 2-GPU workers wanting 8 slots needs 4 hosts' worth of 2 slots each, not 8
    loose slots: a node of one GPU could hold none of its workers."""
    job = JobRequest("wide", min_slots=2, max_slots=8, replica_slots=2)
    previous = {"wide": (("h0", 0), ("h0", 1))}
    wants = FairSharePolicy().slots_wanted([job], CLUSTER, previous)
    shapes = {"wide": BundleShape(replica_slots=2)}
    decision = scale_decision(wants, CLUSTER, shapes=shapes)
    assert decision.bundles == (SlotBundle(2),) * 4
    assert (decision.wanted_slots, decision.extra_slots) == (8, 4)
    # A fixed role's replicas first, each of its own width, then the scaling replicas;
    # a remainder smaller than a replica is not asked for.
    gang = BundleShape(replica_slots=2, gang_slots=(1, 4))
    assert bundles_for(10, gang) == [SlotBundle(1), SlotBundle(4), SlotBundle(2), SlotBundle(2)]
    assert bundles_for(0, gang) == []
    with pytest.raises(ValueError, match="replica_slots"):
        BundleShape(replica_slots=0)


def test_the_cap_keeps_whole_bundles_job_by_job() -> None:
    wants = {"wide": 8, "narrow": 3}
    shapes = {"wide": BundleShape(replica_slots=4)}
    decision = scale_decision(wants, CLUSTER, max_slots=6, shapes=shapes)
    # One 4-slot bundle of the first job fits, its second does not; 2 of the other's do.
    assert decision.bundles == (SlotBundle(4), SlotBundle(1), SlotBundle(1))
    assert (decision.wanted_slots, decision.capped) == (6, True)
    assert decision.by_job == wants


def test_bundles_carry_the_node_labels_their_job_targets() -> None:
    """A job that targets labels (or a group picked by labels) asks for nodes with them;
    the others for any node."""
    a100 = {"gpu": "a100"}
    wants = {"a": 2, "b": 1}
    shapes = {"a": BundleShape(replica_slots=2, labels=a100)}
    decision = scale_decision(wants, CLUSTER, shapes=shapes)
    assert decision.bundles == (SlotBundle(2, a100), SlotBundle(1))
    assert decision.wanted_slots == 3
