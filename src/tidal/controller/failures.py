"""What the controller does when a job's workers fail: replace them, or fail the job.

One unit on purpose: the restart-or-fail decision and carrying it out live together, so
the restart budget means one thing in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidal.backends.base import WorkerStatus
from tidal.controller.cluster import ClusterModel
from tidal.controller.effects import LoopEffects
from tidal.controller.store import Event, JobRecord
from tidal.model import JobState

__all__ = ["fail", "on_failures"]


def on_failures(
    effects: LoopEffects,
    cluster: ClusterModel,
    job: JobRecord,
    failed: Sequence[WorkerStatus],
    now: float,
) -> JobRecord | None:
    """Replace ``failed`` workers on the job's slots, or fail the job once its restart
    budget is spent; the job as it is now, or ``None`` once it is over."""
    # One restart per host that lost workers in this tick: a lost node with four of the
    # job's workers is one failure, not four, and a single crash still counts once.
    restarts = job.restarts + len({w.slot[0] for w in failed})
    limit = effects.model(job).role.restart.max_restarts
    ids = ", ".join(str(w.worker_id) for w in failed)
    codes = [w.exit_code for w in failed]
    if restarts > limit:
        effects.call(job.id, "stop", lambda: effects.backend.stop(job.id))
        fail(
            effects,
            job,
            now,
            f"worker {ids} failed (exit {codes}); restart limit {limit} reached",
            restarts=restarts,
        )
        return None
    # Same slots again: the backend starts a fresh worker on each slot without a live one.
    # Not on slots whose host left the cluster: the policy moves the job off them.
    slots = tuple(s for s in job.slots if cluster.has_slot(s))
    effects.call(job.id, "assign", lambda: effects.backend.assign(job.id, slots))
    return effects.store.update_job(
        job.id,
        now,
        state=JobState.RESCALING,
        restarts=restarts,
        reallocations=job.reallocations + 1,
        rescale_started_at=now,
        reason=f"replacing failed worker {ids} (restart {restarts}/{limit})",
        event=Event(
            "worker_failed",
            f"worker {ids} failed; replacing it (restart {restarts} of {limit})",
            {"workers": ids, "exit_codes": codes, "restarts": restarts},
        ),
    )


def fail(effects: LoopEffects, job: JobRecord, now: float, reason: str, **changes: Any) -> None:
    """Mark the job failed for ``reason``, releasing its slots."""
    effects.store.update_job(
        job.id,
        now,
        slots=() if job.slots else None,
        state=JobState.FAILED,
        reason=reason,
        finished_at=now,
        scale_deadline=None,
        event=Event("failed", reason),
        **changes,
    )
