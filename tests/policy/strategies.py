"""Hypothesis strategies shared by the policy property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from tidal.policy.api import Cluster, Host, JobRequest, Slot


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """One to six hosts of one to eight slots."""
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    return Cluster(tuple(Host(f"h{i}", n) for i, n in enumerate(sizes)))


@st.composite
def job_lists(draw: st.DrawFn, max_jobs: int = 8) -> list[JobRequest]:
    """Up to ``max_jobs`` jobs with random bounds, priorities and targets."""
    count = draw(st.integers(0, max_jobs))
    jobs = []
    for i in range(count):
        low = draw(st.integers(1, 6))
        high = draw(st.integers(low, 12))
        target = draw(st.one_of(st.none(), st.integers(low, high)))
        jobs.append(
            JobRequest(
                job_id=f"j{i}",
                min_slots=low,
                max_slots=high,
                priority=draw(st.sampled_from([1000, 5000, 10000])),
                submitted_at=float(draw(st.integers(0, 5))),
                target_slots=target,
            )
        )
    return jobs


def assert_valid(allocation: dict[str, tuple[Slot, ...]], cluster: Cluster) -> None:
    """No slot twice, none that does not exist."""
    sizes = {h.name: h.slots for h in cluster.hosts}
    taken = [slot for slots in allocation.values() for slot in slots]
    assert len(taken) == len(set(taken))
    for host, index in taken:
        assert 0 <= index < sizes[host]
