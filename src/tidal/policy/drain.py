"""Draining hosts: the allocation without the slots of hosts that are leaving.

A host marked leaving (:attr:`tidal.policy.api.Host.leaving`) gets no new workers, and
every job holding slots there is asked to move off it: the policy is given the same jobs
on the cluster without the leaving hosts, and the slots jobs held there are gone from
what they held before. An elastic job then shrinks off the host at its next step
boundary, and grows elsewhere where the policy finds room; no checkpoint is written.

A job the policy cannot place without the leaving hosts (a fixed-size job with no room
elsewhere, or one whose minimum does not fit) cannot leave in place. It keeps its slots,
training on, until :data:`CHECKPOINT_LEAD` seconds before the host goes; then it is given
no slots, which every backend carries out as a durable checkpoint and a wait (see
:meth:`tidal.backends.base.Backend.assign`), and it resumes from that checkpoint where
room appears. A host leaving at no known time waits for such jobs: they stay until room
appears or the host is undrained.

:func:`evacuate` is pure: the same jobs, cluster, previous allocation and ``now`` give the
same decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.policy.api import Allocation, Cluster, Host, JobRequest, Policy, Slot

__all__ = ["CHECKPOINT_LEAD", "CheckpointOrder", "DrainDecision", "evacuate"]

#: Seconds before a host goes at which a job that cannot leave in place is stopped with a
#: checkpoint. A cloud's shortest notice is 30 s (GCP spot VMs, Azure's Preempt event):
#: such a job checkpoints at once.
CHECKPOINT_LEAD = 30.0


@dataclass(frozen=True)
class CheckpointOrder:
    """A job that cannot leave ``host`` in place: it checkpoints at ``at``, before the
    host goes at ``deadline``, and resumes from that checkpoint elsewhere."""

    job_id: str
    host: str
    deadline: float
    at: float


@dataclass(frozen=True)
class DrainDecision:
    """The allocation with leaving hosts drained, and what it asks of the jobs there."""

    allocation: dict[str, tuple[Slot, ...]]
    #: Jobs that cannot leave in place and hold a leaving host with a deadline.
    checkpoints: tuple[CheckpointOrder, ...] = ()
    #: Jobs left on a leaving host for now (no room elsewhere, the checkpoint not due).
    staying: tuple[str, ...] = ()


def evacuate(
    policy: Policy,
    jobs: Sequence[JobRequest],
    cluster: Cluster,
    previous: Allocation,
    now: float,
    *,
    checkpoint_lead: float = CHECKPOINT_LEAD,
) -> DrainDecision:
    """Ask ``policy`` for the next allocation with the leaving hosts of ``cluster`` drained.

    Without leaving hosts this is ``policy.allocate`` unchanged.
    """
    leaving = cluster.leaving
    if not leaving:
        return DrainDecision(dict(policy.allocate(jobs, cluster, previous)))
    staying_hosts = tuple(h for h in cluster.hosts if not h.leaving)
    least = {j.job_id: j.min_slots for j in jobs}
    kept_previous: dict[str, tuple[Slot, ...]] = {}
    for job_id, slots in previous.items():
        kept = tuple(s for s in slots if s[0] not in leaving)
        # Fewer than its minimum is not a size the job can run at: the policy places it
        # afresh rather than keeping (and growing from) an invalid allocation.
        if len(kept) >= least.get(job_id, 1):
            kept_previous[job_id] = kept
    first = policy.allocate(jobs, Cluster(staying_hosts), kept_previous)
    orders: list[CheckpointOrder] = []
    stay: list[str] = []
    for job in jobs:
        on_leaving = sorted({s[0] for s in previous.get(job.job_id, ()) if s[0] in leaving})
        if not on_leaving or first.get(job.job_id):
            continue
        dated = [(d, h) for h in on_leaving if (d := leaving[h]) is not None]
        if dated:
            deadline, host = min(dated)
            at = max(now, deadline - checkpoint_lead)
            orders.append(CheckpointOrder(job.job_id, host, deadline, at))
            if now >= at:
                continue
        stay.append(job.job_id)
    if not stay:
        return DrainDecision(dict(first), tuple(orders))
    reserved = {job_id: tuple(previous[job_id]) for job_id in stay}
    rest = [j for j in jobs if j.job_id not in reserved]
    allocation = _allocate_around(policy, rest, staying_hosts, kept_previous, reserved)
    allocation.update(reserved)
    return DrainDecision(allocation, tuple(orders), tuple(stay))


def _allocate_around(
    policy: Policy,
    jobs: Sequence[JobRequest],
    hosts: Sequence[Host],
    previous: Allocation,
    reserved: Mapping[str, tuple[Slot, ...]],
) -> dict[str, tuple[Slot, ...]]:
    """``policy``'s allocation of ``jobs`` on ``hosts`` less the ``reserved`` slots.

    A policy sees a host as ``slots`` interchangeable indices, so each host is shown with
    its free slots only, numbered ``0 ..``; the answer is numbered back.
    """
    taken = {s for slots in reserved.values() for s in slots}
    free = {h.name: [i for i in range(h.slots) if (h.name, i) not in taken] for h in hosts}
    shown = {name: {index: i for i, index in enumerate(indices)} for name, indices in free.items()}
    view = Cluster(
        tuple(Host(h.name, len(free[h.name]), h.group, h.labels) for h in hosts if free[h.name])
    )
    previous_view = {
        job_id: tuple((n, shown[n][i]) for n, i in slots if n in shown and i in shown[n])
        for job_id, slots in previous.items()
        if job_id not in reserved
    }
    answer = policy.allocate(jobs, view, previous_view)
    return {
        job_id: tuple(sorted((n, free[n][i]) for n, i in slots))
        for job_id, slots in answer.items()
        if slots
    }
