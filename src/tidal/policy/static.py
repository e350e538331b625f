"""``static``: first come, first served, each job at its requested size; the baseline."""

from __future__ import annotations

from collections.abc import Sequence

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.policy.placement import group_capacities, held_counts, place


def requested_size(job: JobRequest) -> int:
    """The size a fixed-size policy gives ``job``: its manual target, else its maximum."""
    return job.target_workers if job.target_workers is not None else job.max_workers


class StaticPolicy:
    """FIFO: in submission order each job gets its requested size or waits.

    Running jobs are never preempted or resized and stay on their slots. The queue is
    strictly ordered (no backfilling), so a large job at its head is never starved by
    smaller ones behind it. A request larger than its group can ever offer is cut to the
    group's size instead of blocking the queue forever.
    """

    name = "static"

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """Keep running jobs, then start queued jobs in order while they fit."""
        capacity = group_capacities(cluster)
        free = dict(capacity)
        held = held_counts(previous)
        by_id = {job.job_id: job for job in jobs}
        counts: dict[str, int] = {}
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in held:
                size = held[job.job_id]
                counts[job.job_id] = size
                _consume(free, job.group, size)
        blocked = False
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in counts or blocked:
                continue
            size = min(requested_size(job), capacity.get(job.group, 0))
            if size <= 0:
                continue
            if size > free[None] or size > free.get(job.group, 0):
                blocked = True
                continue
            counts[job.job_id] = size
            _consume(free, job.group, size)
        return place(counts, by_id, cluster, previous)


def _consume(free: dict[str | None, int], group: str | None, size: int) -> None:
    """Take ``size`` slots from the cluster total and from ``group``'s pool."""
    free[None] -= size
    if group is not None:
        free[group] = free.get(group, 0) - size
