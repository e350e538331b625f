"""``tiresias``: discretised least-attained-service, fixed job sizes (after Tiresias, NSDI'19).

Jobs sit in priority queues by the GPU-time they have received so far: a job starts in
the first queue and is demoted as its attained service crosses each threshold. Queues are
served in order and each queue first come, first served; a job gets exactly its requested
size or nothing. Every decision starts from scratch, so a job in a lower queue loses its
slots (is preempted) when jobs in higher queues need them; jobs that do not fit are skipped
so smaller ones behind them can use the leftover slots.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.policy.budget import SlotBudget, requested_size
from tidal.policy.placement import place

#: Attained service (slot-seconds) at which a job drops to the next queue.
DEFAULT_THRESHOLDS = (3600.0, 36000.0)


class TiresiasPolicy:
    """Least attained service over discrete queues, with preemption between queues."""

    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> None:
        """``thresholds``: increasing attained-service limits of the queues (slot-seconds)."""
        self.thresholds = tuple(sorted(thresholds))

    def queue_of(self, job: JobRequest) -> int:
        """Index of the queue ``job`` is in (0 is served first)."""
        return bisect.bisect_right(self.thresholds, job.attained_service)

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """Serve the queues in order; jobs that do not fit wait (or are preempted)."""
        budget = SlotBudget(cluster)
        by_id = {job.job_id: job for job in jobs}
        counts: dict[str, int] = {}
        for job in sorted(jobs, key=lambda j: (self.queue_of(j), j.submitted_at, j.job_id)):
            size = min(requested_size(job), budget.size_of(job.group))
            if size <= 0 or size > budget.room(job.group):
                continue
            counts[job.job_id] = size
            budget.take(job.group, size)
        return place(counts, by_id, cluster, previous)
