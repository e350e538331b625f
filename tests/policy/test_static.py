"""static: FIFO at the requested size, no preemption."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.budget import requested_size
from tidal.policy.static import StaticPolicy

from .strategies import assert_valid, clusters, job_lists

CLUSTER = Cluster((Host("h0", 4), Host("h1", 4)))


def test_jobs_get_their_size_in_submission_order_or_wait() -> None:
    jobs = [
        JobRequest("first", 1, 4, submitted_at=0),
        JobRequest("second", 1, 3, target_slots=2, submitted_at=1),
        JobRequest("third", 1, 4, submitted_at=2),
    ]
    alloc = StaticPolicy().allocate(jobs, CLUSTER, {})
    assert {j: len(s) for j, s in alloc.items()} == {"first": 4, "second": 2}


def test_running_jobs_are_never_moved_or_preempted() -> None:
    held = {"late": (("h0", 1), ("h1", 2))}
    jobs = [JobRequest("early", 8, 8, submitted_at=0), JobRequest("late", 2, 2, submitted_at=5)]
    assert StaticPolicy().allocate(jobs, CLUSTER, held) == held


def test_queue_is_strict_first_come_first_served() -> None:
    held = {"running": (("h0", 0), ("h0", 1), ("h0", 2), ("h0", 3), ("h1", 0))}
    jobs = [
        JobRequest("running", 5, 5, submitted_at=0),
        JobRequest("big", 4, 4, submitted_at=1),
        JobRequest("small", 1, 1, submitted_at=2),
    ]
    assert set(StaticPolicy().allocate(jobs, CLUSTER, held)) == {"running"}


def test_oversized_request_is_cut_to_the_cluster() -> None:
    alloc = StaticPolicy().allocate([JobRequest("huge", 1, 100)], CLUSTER, {})
    assert len(alloc["huge"]) == 8


@settings(max_examples=150, deadline=None)
@given(jobs=job_lists(), cluster=clusters())
def test_properties(jobs: list[JobRequest], cluster: Cluster) -> None:
    policy = StaticPolicy()
    alloc = policy.allocate(jobs, cluster, {})
    assert_valid(alloc, cluster)
    by_id = {j.job_id: j for j in jobs}
    for job_id, slots in alloc.items():
        assert len(slots) == min(requested_size(by_id[job_id]), cluster.total_slots)
    assert policy.allocate(list(reversed(jobs)), cluster, {}) == alloc
    # Replaying keeps every running job exactly where it is.
    again = policy.allocate(jobs, cluster, alloc)
    assert {j: again[j] for j in alloc} == alloc


def test_a_plugin_reading_the_former_field_names_gets_slots_and_a_warning() -> None:
    # Policy plugins (`--policy module:Class`) were written against *_workers.
    job = JobRequest("j", 2, 6, target_slots=4)
    with pytest.warns(DeprecationWarning, match="read JobRequest.min_slots"):
        assert job.min_workers == 2
    with pytest.warns(DeprecationWarning, match="read JobRequest.max_slots"):
        assert job.max_workers == 6
    with pytest.warns(DeprecationWarning, match="read JobRequest.target_slots"):
        assert job.target_workers == 4
