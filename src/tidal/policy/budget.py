"""Bookkeeping every policy shares: a job's size bounds, queue order and free slots, and
the frame of a policy that decides counts first and places them after (:class:`CountingPolicy`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.policy.placement import held_counts, place


def slot_cap(job: JobRequest) -> int:
    """Most slots an elastic ``job`` may get: its manual target if set, else its maximum."""
    if job.target_slots is not None:
        return max(0, min(job.target_slots, job.max_slots))
    return max(0, job.max_slots)


def requested_size(job: JobRequest) -> int:
    """The size a fixed-size policy gives ``job``: its manual target, else its maximum."""
    return job.target_slots if job.target_slots is not None else job.max_slots


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


@dataclass
class Decision:
    """One decision's inputs and the bookkeeping every policy starts from."""

    jobs: Sequence[JobRequest]
    cluster: Cluster
    previous: Allocation
    #: Slots not promised yet; a policy takes from it as it sizes jobs.
    budget: SlotBudget
    #: How many slots each job holds in ``previous``.
    held: dict[str, int]
    by_id: dict[str, JobRequest]


def start_decision(jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation) -> Decision:
    """The :class:`Decision` for ``jobs``: every slot free in the budget, what each job holds."""
    return Decision(
        jobs=jobs,
        cluster=cluster,
        previous=previous,
        budget=SlotBudget(cluster),
        held=held_counts(previous),
        by_id={job.job_id: job for job in jobs},
    )


class CountingPolicy(ABC):
    """A policy that decides how many slots each job gets (:meth:`counts`), then places
    them (:meth:`place`, by default :func:`~tidal.policy.placement.place`)."""

    name: str

    def allocate(
        self,
        jobs: Sequence[JobRequest],
        cluster: Cluster,
        previous: Allocation,
    ) -> dict[str, tuple[Slot, ...]]:
        """Size every job, then place the sizes; deterministic for equal inputs."""
        decision = start_decision(jobs, cluster, previous)
        return self.place(self.counts(decision), decision)

    @abstractmethod
    def counts(self, decision: Decision) -> dict[str, int]:
        """How many slots each job gets (jobs left out get none)."""

    def place(self, counts: Mapping[str, int], decision: Decision) -> dict[str, tuple[Slot, ...]]:
        """Concrete slots for ``counts``, moving as little as possible."""
        return place(counts, decision.by_id, decision.cluster, decision.previous)
