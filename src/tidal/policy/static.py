"""``static``: first come, first served, each job at its requested size; the baseline."""

from __future__ import annotations

from tidal.policy.budget import CountingPolicy, Decision, requested_size


class StaticPolicy(CountingPolicy):
    """FIFO: in submission order each job gets its requested size or waits.

    Running jobs are never preempted or resized and stay on their slots. The queue is
    strictly ordered (no backfilling), so a large job at its head is never starved by
    smaller ones behind it. A request larger than its group can ever offer is cut to the
    group's size instead of blocking the queue forever.
    """

    name = "static"

    def counts(self, decision: Decision) -> dict[str, int]:
        """Keep running jobs, then start queued jobs in order while they fit."""
        budget, held = decision.budget, decision.held
        counts: dict[str, int] = {}
        for job in sorted(decision.jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in held:
                size = held[job.job_id]
                counts[job.job_id] = size
                budget.take(job.group, size)
        blocked = False
        for job in sorted(decision.jobs, key=lambda j: (j.submitted_at, j.job_id)):
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
        return counts
