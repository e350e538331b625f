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
from collections.abc import Mapping, Sequence

from tidal.policy.api import JobRequest, Slot
from tidal.policy.budget import CountingPolicy, Decision, requested_size

#: Attained service (slot-seconds) at which a job drops to the next queue.
DEFAULT_THRESHOLDS = (3600.0, 36000.0)


class TiresiasPolicy(CountingPolicy):
    """Least attained service over discrete queues, with preemption between queues."""

    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> None:
        """``thresholds``: increasing attained-service limits of the queues (slot-seconds)."""
        self.thresholds = tuple(sorted(thresholds))

    def queue_of(self, job: JobRequest) -> int:
        """Index of the queue ``job`` is in (0 is served first)."""
        return bisect.bisect_right(self.thresholds, job.attained_service)

    def counts(self, decision: Decision) -> dict[str, int]:
        """Serve the queues in order; jobs that do not fit wait (or are preempted)."""
        budget = decision.budget
        counts: dict[str, int] = {}
        for job in sorted(
            decision.jobs, key=lambda j: (self.queue_of(j), j.submitted_at, j.job_id)
        ):
            size = min(requested_size(job), budget.size_of(job.group))
            if size <= 0 or size > budget.room(job.group):
                continue
            counts[job.job_id] = size
            budget.take(job.group, size)
        return counts


#: The Pollux artifact's Tiresias: one threshold at 16 GPU-hours (slot-seconds).
ARTIFACT_THRESHOLDS = (16 * 3600.0,)


class TiresiasArtifactPolicy(TiresiasPolicy):
    """Tiresias as the Pollux paper's artifact runs it, to calibrate the simulator against.

    Two queues split at 16 GPU-hours of attained service; a job gets exactly its requested
    size or nothing. Running jobs that stay keep their slots; a job that starts takes its
    slots from the host with most free slots, again and again until it has them all (which
    spreads jobs over hosts more than :func:`~tidal.policy.placement.place` does).
    """

    name = "tiresias-artifact"

    def __init__(self) -> None:
        """Queues as in the artifact."""
        super().__init__(ARTIFACT_THRESHOLDS)

    def counts(self, decision: Decision) -> dict[str, int]:
        """Serve the queues in order, each job at its requested size or not at all."""
        remaining = decision.cluster.total_slots
        counts: dict[str, int] = {}
        for job in sorted(
            decision.jobs, key=lambda j: (self.queue_of(j), j.submitted_at, j.job_id)
        ):
            size = requested_size(job)
            if 0 < size <= remaining:
                counts[job.job_id] = size
                remaining -= size
        return counts

    def place(self, counts: Mapping[str, int], decision: Decision) -> dict[str, tuple[Slot, ...]]:
        """Jobs keep their slots; starting jobs take slots from the emptiest hosts."""
        cluster, previous = decision.cluster, decision.previous
        free = {h.name: set(range(h.slots)) for h in cluster.hosts}
        result: dict[str, tuple[Slot, ...]] = {}
        starting: list[tuple[str, int]] = []
        for job_id, size in counts.items():
            held = previous.get(job_id, ())
            if held and len(held) == size:
                result[job_id] = tuple(held)
                for host, index in held:
                    free[host].discard(index)
            else:
                starting.append((job_id, size))
        position = {h.name: i for i, h in enumerate(cluster.hosts)}
        for job_id, size in starting:
            slots: list[Slot] = []
            while len(slots) < size:
                # The first host (in cluster order) among those with most free slots.
                host = max(free, key=lambda name: (len(free[name]), -position[name]))
                take = sorted(free[host])[: size - len(slots)]
                free[host].difference_update(take)
                slots += [(host, index) for index in take]
            # Ranked in the order the slots were taken.
            result[job_id] = tuple(slots)
        return result
