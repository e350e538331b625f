"""tiresias: least attained service first, fixed sizes, preemption between queues."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.budget import requested_size
from tidal.policy.tiresias import TiresiasArtifactPolicy, TiresiasPolicy

from .strategies import assert_valid, clusters, job_lists

CLUSTER = Cluster((Host("h0", 4),))


def test_a_fresh_job_preempts_one_that_has_had_its_service() -> None:
    policy = TiresiasPolicy(thresholds=(100.0,))
    old = JobRequest("old", 4, 4, submitted_at=0, attained_service=500.0)
    new = JobRequest("new", 4, 4, submitted_at=10)
    held = {"old": (("h0", 0), ("h0", 1), ("h0", 2), ("h0", 3))}
    assert set(policy.allocate([old, new], CLUSTER, held)) == {"new"}


def test_fifo_within_a_queue_and_fixed_sizes() -> None:
    policy = TiresiasPolicy(thresholds=(100.0,))
    jobs = [
        JobRequest("b", 3, 3, submitted_at=2, attained_service=50.0),
        JobRequest("a", 3, 3, submitted_at=1, attained_service=90.0),
        JobRequest("c", 1, 1, submitted_at=3),
    ]
    alloc = policy.allocate(jobs, CLUSTER, {})
    assert {j: len(s) for j, s in alloc.items()} == {"a": 3, "c": 1}


def test_queue_index_follows_thresholds() -> None:
    policy = TiresiasPolicy(thresholds=(10.0, 100.0))
    assert [
        policy.queue_of(JobRequest("j", 1, 1, attained_service=s)) for s in (0, 10, 99, 1000)
    ] == [0, 1, 1, 2]


@settings(max_examples=100, deadline=None)
@given(
    jobs=job_lists(),
    cluster=clusters(),
    service=st.lists(st.floats(0, 1e5), min_size=8, max_size=8),
)
def test_properties(jobs: list[JobRequest], cluster: Cluster, service: list[float]) -> None:
    jobs = [replace(job, attained_service=service[i]) for i, job in enumerate(jobs)]
    policy = TiresiasPolicy()
    alloc = policy.allocate(jobs, cluster, {})
    assert_valid(alloc, cluster)
    by_id = {j.job_id: j for j in jobs}
    for job_id, slots in alloc.items():
        assert len(slots) == min(requested_size(by_id[job_id]), cluster.total_slots)
    assert policy.allocate(list(reversed(jobs)), cluster, {}) == alloc
    # Work-conserving: a job waiting in any queue must be too big for the slots left free.
    free = cluster.total_slots - sum(len(s) for s in alloc.values())
    for job in jobs:
        if job.job_id not in alloc:
            assert min(requested_size(job), cluster.total_slots) > free


def test_artifact_variant_demotes_at_16_gpu_hours_and_spreads_over_emptiest_hosts() -> None:
    cluster = Cluster(tuple(Host(f"h{i}", 4) for i in range(3)))
    policy = TiresiasArtifactPolicy()
    held = {"run": (("h0", 0), ("h0", 1), ("h0", 2))}
    running = JobRequest("run", 3, 3, submitted_at=0, attained_service=1000.0)
    big = JobRequest("big", 6, 6, submitted_at=5)
    alloc = policy.allocate([running, big], cluster, held)
    assert alloc["run"] == held["run"]
    # Most free first: all of h1, then h2 (4 free) before h0 (1 free): 4 + 2.
    assert [host for host, _ in alloc["big"]] == ["h1"] * 4 + ["h2"] * 2
    demoted = replace(running, attained_service=16 * 3600.0)
    late = JobRequest("late", 12, 12, submitted_at=9)
    assert set(policy.allocate([demoted, late], cluster, held)) == {"late"}
