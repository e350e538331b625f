"""Bookkeeping every policy shares: a job's size bounds, queue order and free slots."""

from __future__ import annotations

from tidal.policy.api import Cluster, JobRequest


def worker_cap(job: JobRequest) -> int:
    """Most slots an elastic ``job`` may get: its manual target if set, else its maximum."""
    if job.target_workers is not None:
        return max(0, min(job.target_workers, job.max_workers))
    return max(0, job.max_workers)


def requested_size(job: JobRequest) -> int:
    """The size a fixed-size policy gives ``job``: its manual target, else its maximum."""
    return job.target_workers if job.target_workers is not None else job.max_workers


def queue_order(job: JobRequest) -> tuple[int, float, str]:
    """Sort key of a priority queue: higher priority first, then submission order."""
    return (-job.priority, job.submitted_at, job.job_id)


class SlotBudget:
    """Slots not yet promised to a job, in the whole cluster and per host group.

    A job of a group draws from both its group's pool and the cluster total; a job without
    a group from the total only. Counts that stay within the budget can always be placed.
    """

    def __init__(self, cluster: Cluster) -> None:
        """Start with every slot of ``cluster`` free."""
        self.capacity: dict[str | None, int] = {None: cluster.total_slots}
        for host in cluster.hosts:
            if host.group is not None:
                self.capacity[host.group] = self.capacity.get(host.group, 0) + host.slots
        self.free = dict(self.capacity)

    def size_of(self, group: str | None) -> int:
        """All slots a job of ``group`` could ever use."""
        return self.capacity.get(group, 0)

    def room(self, group: str | None) -> int:
        """Slots still free for a job of ``group``."""
        if group is None:
            return self.free[None]
        return min(self.free[None], self.free.get(group, 0))

    def take(self, group: str | None, size: int) -> None:
        """Promise ``size`` slots to a job of ``group``."""
        self.free[None] -= size
        if group is not None:
            self.free[group] = self.free.get(group, 0) - size
