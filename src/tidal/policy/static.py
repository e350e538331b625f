"""``static``: first come, first served, each job at its requested size; the baseline."""

from __future__ import annotations

from collections.abc import Sequence

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.policy.budget import SlotBudget, requested_size
from tidal.policy.placement import held_counts, place


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
        budget = SlotBudget(cluster)
        held = held_counts(previous)
        by_id = {job.job_id: job for job in jobs}
        counts: dict[str, int] = {}
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in held:
                size = held[job.job_id]
                counts[job.job_id] = size
                budget.take(job.group, size)
        blocked = False
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in counts or blocked:
                continue
            size = min(requested_size(job), budget.size_of(job.group))
            if size <= 0:
                continue
            if size > budget.room(job.group):
                blocked = True
                continue
            counts[job.job_id] = size
            budget.take(job.group, size)
        return place(counts, by_id, cluster, previous)
