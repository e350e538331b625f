"""Carrying out a new allocation for one job: start it, resume it, preempt it or resize it,
and record the change with its event and a point on the allocation timeline."""

from __future__ import annotations

from collections.abc import Callable

from tidal.controller.loop.effects import LoopEffects
from tidal.controller.loop.failures import fail
from tidal.controller.store.jobs import Event, JobRecord
from tidal.launch.api import JobLaunch
from tidal.model_states import JobState
from tidal.policy.api import Slot

__all__ = ["apply_slots"]


def apply_slots(
    effects: LoopEffects,
    job: JobRecord,
    slots: tuple[Slot, ...],
    launch: Callable[[], JobLaunch],
    now: float,
    *,
    known: bool,
) -> tuple[Slot, ...]:
    """Tell the backend ``job`` now runs on ``slots`` and record it; returns the slots the
    job holds afterwards.

    ``known``: the backend still has the job (preempted to zero earlier), so it resumes
    with ``assign`` rather than a fresh ``start`` of what ``launch`` builds.
    """
    store, backend = effects.store, effects.backend
    effects.clear(job.id)
    old = len(job.slots)
    # Messages count workers (a worker of several GPUs holds several slots); data, slots.
    workers = effects.model(job).workers_of
    if not job.slots:
        resumed = job.started_at is not None
        if known:
            ok = effects.call(job.id, "assign", lambda: backend.assign(job.id, slots))
        else:
            ok = effects.call(job.id, "start", lambda: backend.start(launch(), slots))
        if not ok:
            fail(effects, job, now, "the backend could not start the job")
            return ()
        store.update_job(
            job.id,
            now,
            slots=slots,
            state=JobState.RUNNING,
            reallocations=job.reallocations + 1,
            started_at=job.started_at if resumed else now,
            reason=f"running on {len(slots)} slot(s)",
            event=Event(
                "resumed" if resumed else "started",
                f"{workers(len(slots))} worker(s)",
                {"workers": len(slots)},
            ),
        )
    elif not slots:
        if not effects.call(job.id, "assign", lambda: backend.assign(job.id, ())):
            return job.slots
        store.update_job(
            job.id,
            now,
            slots=(),
            state=JobState.QUEUED,
            rescale_started_at=None,
            reason="preempted: its slots went to other jobs",
            event=Event("preempted", f"{workers(old)} → 0 worker(s)", {"from": old, "to": 0}),
        )
    else:
        if not effects.call(job.id, "assign", lambda: backend.assign(job.id, slots)):
            return job.slots
        effects.metrics.rescales.inc()
        store.update_job(
            job.id,
            now,
            slots=slots,
            state=JobState.RESCALING,
            reallocations=job.reallocations + 1,
            rescale_started_at=now,
            reason=f"rescaling {workers(old)} → {workers(len(slots))} worker(s)",
            event=Event(
                "rescale",
                f"{workers(old)} → {workers(len(slots))} worker(s)",
                {"from": old, "to": len(slots)},
            ),
        )
    return slots
