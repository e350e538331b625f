"""Scale-out deadlines: a ``tidal scale-out --timeout`` that is not reached in time is
rolled back to the target the job had before.

:func:`decide_deadline` is the pure decision; :func:`check_deadline` carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.controller.store.jobs import Event, JobRecord, JobStore
from tidal.model_states import JobState

__all__ = ["DeadlineMet", "DeadlineMissed", "check_deadline", "decide_deadline"]


@dataclass(frozen=True)
class DeadlineMet:
    """The job runs at (or above) the size it was asked to grow to: ``slots``."""

    slots: int


@dataclass(frozen=True)
class DeadlineMissed:
    """The deadline passed first: the target goes back to ``restored``."""

    target: int
    restored: int | None


def decide_deadline(job: JobRecord, now: float) -> DeadlineMet | DeadlineMissed | None:
    """What a pending scale-out deadline means for ``job`` at ``now`` (``None``: nothing
    pending, or it is still running)."""
    if job.scale_deadline is None:
        return None
    target = job.target_slots or 0
    if job.state is JobState.RUNNING and len(job.slots) >= target:
        return DeadlineMet(len(job.slots))
    if now < job.scale_deadline:
        return None
    return DeadlineMissed(target, job.scale_previous)


def check_deadline(store: JobStore, job: JobRecord, now: float) -> JobRecord:
    """Settle ``job``'s scale-out deadline if it is met or missed; the job afterwards."""
    decision = decide_deadline(job, now)
    if isinstance(decision, DeadlineMet):
        return store.update_job(
            job.id,
            now,
            scale_deadline=None,
            scale_previous=None,
            event=Event("scale_out_done", f"reached {decision.slots} worker(s)"),
        )
    if isinstance(decision, DeadlineMissed):
        return store.update_job(
            job.id,
            now,
            target_slots=decision.restored,
            scale_deadline=None,
            scale_previous=None,
            event=Event(
                "scale_out_rolled_back",
                f"could not reach {decision.target} worker(s) in time; target restored",
                {"target": decision.target, "restored": decision.restored},
            ),
        )
    return job
