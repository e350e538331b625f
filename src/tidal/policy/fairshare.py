"""``fairshare``: slots in proportion to priority, within each job's min and max.

The controller's default policy. For the admitted jobs of one pool of ``S`` slots, job ``j``
with priority ``p_j`` is owed ``S * p_j / sum(p)`` slots; shares outside ``[min_j, cap_j]``
are clipped (``cap_j`` is ``max_slots``, or ``target_slots`` when a user set one) and the
slack is shared again in proportion to priority among the others (water-filling). Whole
slots are handed out by largest remainder.

Admission: running jobs stay admitted; queued jobs are admitted in priority, then
submission order while the sum of admitted minimums fits, so a newcomer first shrinks the
elastic jobs towards their minimum and only queues when even that does not make room. The
queue is strict: a job whose minimum does not fit holds back the jobs behind it.

Groups: jobs of a group share that group's hosts; jobs without a group share what the
grouped jobs leave of the whole cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tidal.policy.api import Allocation, Cluster, JobRequest
from tidal.policy.autoscale import fairshare_wants, floor_slots
from tidal.policy.budget import CountingPolicy, Decision, queue_order, slot_cap

#: A job keeps its extra rounding slot unless another job's fractional claim beats its own
#: by more than this: stops a slot bouncing between two jobs over rounding noise.
ROUNDING_HYSTERESIS = 0.25


def proportional_shares(jobs: Sequence[JobRequest], slots: int) -> dict[str, float]:
    """Real-valued shares of ``slots`` ∝ priority, clipped to each job's bounds.

    Water-filling: find the level ``L`` with ``sum(clip(L * p_j, min_j, cap_j)) == slots``.
    The sum is piecewise linear in ``L`` with a kink where a job reaches its minimum or its
    cap, so walking the kinks in order finds ``L`` exactly in ``O(n log n)``.
    """
    low = {j.job_id: float(floor_slots(j)) for j in jobs}
    high = {j.job_id: float(slot_cap(j)) for j in jobs}
    if sum(high.values()) <= slots:
        return high
    if sum(low.values()) >= slots:
        return low
    weight = {j.job_id: float(max(j.priority, 1)) for j in jobs}
    kinks = sorted(
        [(low[j] / weight[j], 0, j) for j in weight] + [(high[j] / weight[j], 1, j) for j in weight]
    )
    # Below the first kink every job sits at its minimum: the sum is ``base + slope * L``.
    base, slope = sum(low.values()), 0.0
    level = kinks[-1][0]
    for at, kind, job_id in kinks:
        if slope > 0 and base + slope * at >= slots:
            level = (slots - base) / slope
            break
        if kind == 0:  # the job starts growing with the level
            base -= low[job_id]
            slope += weight[job_id]
        else:  # the job stops at its cap
            base += high[job_id]
            slope -= weight[job_id]
    return {j: min(high[j], max(low[j], level * weight[j])) for j in weight}


def whole_shares(jobs: Sequence[JobRequest], slots: int, held: dict[str, int]) -> dict[str, int]:
    """Integer shares by largest remainder, with hysteresis towards what jobs hold now."""
    shares = proportional_shares(jobs, slots)
    counts = {job_id: math.floor(share + 1e-9) for job_id, share in shares.items()}
    leftover = min(slots, sum(slot_cap(j) for j in jobs)) - sum(counts.values())

    def claim(job: JobRequest) -> tuple[float, int, float, str]:
        remainder = shares[job.job_id] - counts[job.job_id]
        if held.get(job.job_id, 0) > counts[job.job_id]:
            remainder += ROUNDING_HYSTERESIS
        return (-remainder, -job.priority, job.submitted_at, job.job_id)

    candidates = sorted((j for j in jobs if counts[j.job_id] < slot_cap(j)), key=claim)
    for job in candidates[: max(0, leftover)]:
        counts[job.job_id] += 1
    return counts


class FairSharePolicy(CountingPolicy):
    """Priority-proportional shares of the slots; see the module docstring."""

    name = "fairshare"

    def counts(self, decision: Decision) -> dict[str, int]:
        """Admit and share out, pool by pool."""
        counts: dict[str, int] = {}
        # Grouped pools first: ungrouped jobs share whatever the groups leave.
        pools = sorted({j.group for j in decision.jobs if j.group is not None})
        for group in [*pools, None]:
            members = [j for j in decision.jobs if j.group == group and slot_cap(j) > 0]
            slots = decision.budget.room(group)
            admitted = _admit(members, slots, decision.held)
            pool_counts = whole_shares(admitted, slots, decision.held)
            counts.update(pool_counts)
            decision.budget.take(group, sum(pool_counts.values()))
        return counts

    def slots_wanted(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, int]:
        """Running jobs up to their cap, queued ones their minimum (``--autoscale``)."""
        return fairshare_wants(jobs, previous)


def _admit(jobs: Sequence[JobRequest], slots: int, held: dict[str, int]) -> list[JobRequest]:
    """Running jobs first, then the queue in order while the minimums fit."""
    admitted: list[JobRequest] = []
    need = 0
    running = sorted((j for j in jobs if held.get(j.job_id, 0) > 0), key=queue_order)
    queued = sorted((j for j in jobs if held.get(j.job_id, 0) == 0), key=queue_order)
    for job in running:
        # Only a cluster that lost hosts can fail this: the least important go back to the queue.
        if need + floor_slots(job) <= slots:
            admitted.append(job)
            need += floor_slots(job)
    for job in queued:
        if need + floor_slots(job) > slots:
            break
        admitted.append(job)
        need += floor_slots(job)
    return admitted
