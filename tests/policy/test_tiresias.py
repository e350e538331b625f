"""tiresias: least attained service first, fixed sizes, preemption between queues."""

from __future__ import annotations

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.tiresias import TiresiasPolicy

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
