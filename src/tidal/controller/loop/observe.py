"""Observing a job: what its pending requests change, and what the backend reports.

:func:`observe` turns one job's backend status into store changes: a cancel carried out,
workers lost, the job finished or failed, failed workers handed to
:mod:`tidal.controller.loop.failures`, a rescale that settled, service attained.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.effects import LoopEffects
from tidal.controller.loop.failures import end_workers, fail, on_failures
from tidal.controller.store.jobs import Event, JobRecord
from tidal.controller.store.requests import Cancel, PendingRequest, apply_requests
from tidal.launch.api import JobStatus, WorkerState
from tidal.model_states import ACTIVE_STATES, JobState
from tidal.policy.api import Slot, ThroughputModel
from tidal.policy.goodput_model import model_from_dict

__all__ = ["apply_pending", "cancel_unstarted", "observe", "settled", "throughput_models"]

log = logging.getLogger(__name__)


def apply_pending(
    effects: LoopEffects, job: JobRecord, pending: Sequence[PendingRequest], now: float
) -> JobRecord:
    """Carry out the requests users made of ``job`` since the last tick.

    A cancel is carried out by :func:`observe` in this same tick, and the job's end drops
    whatever requests it had: one write for it rather than two (a burst of cancels is
    as many writes in one tick, and the next request waits for all of them)."""
    if not pending:
        return job
    decided = apply_requests(job, pending)
    if decided.changes.get("cancel_requested"):
        return replace(job, cancel_requested=True)
    return effects.store.update_job(job.id, now, applied=decided.applied, **decided.changes)


def cancel_unstarted(
    effects: LoopEffects,
    jobs: Sequence[JobRecord],
    pending: Mapping[str, Sequence[PendingRequest]],
    statuses: Mapping[str, JobStatus],
    now: float,
) -> set[str]:
    """Cancel in one write every job of ``jobs`` asked to be (now or before) that never
    started and that the backend does not run: nothing to stop, no worker to end. The
    ids cancelled; none if the write failed (:func:`observe` then cancels them one by
    one)."""
    ids = [
        j.id
        for j in jobs
        if j.started_at is None
        and j.id not in statuses
        and (
            j.cancel_requested or any(isinstance(p.request, Cancel) for p in pending.get(j.id, ()))
        )
    ]
    changes = {
        "state": JobState.CANCELLED,
        "reason": "cancelled by user",
        "finished_at": now,
        "scale_deadline": None,
    }
    cancelled = Event("cancelled", "cancelled by user")
    try:
        effects.store.update_jobs([(job_id, cancelled, changes) for job_id in ids], now)
    except Exception:
        log.exception("cancelling %d queued job(s) at once failed", len(ids))
        return set()
    return set(ids)


def observe(
    effects: LoopEffects,
    cluster: ClusterModel,
    job: JobRecord,
    status: JobStatus | None,
    now: float,
    elapsed: float,
) -> JobRecord | None:
    """Apply what the backend reports; the job as it is now, or None once it is over."""
    store, backend = effects.store, effects.backend
    if job.cancel_requested:
        if status is not None:
            effects.call(job.id, "stop", lambda: backend.stop(job.id))
        if job.started_at is not None:  # a job never started has no workers to end
            end_workers(effects, job.id, now)
        store.update_job(
            job.id,
            now,
            slots=() if job.slots else None,
            state=JobState.CANCELLED,
            reason="cancelled by user",
            finished_at=now,
            scale_deadline=None,
            event=Event("cancelled", "cancelled by user"),
        )
        return None
    if not job.state.holds_slots:
        return job
    if status is None:
        # The backend does not run it (e.g. the controller restarted): queue it again so
        # it resumes from its checkpoint instead of being counted as running forever.
        end_workers(effects, job.id, now)
        return store.update_job(
            job.id,
            now,
            slots=(),
            state=JobState.QUEUED,
            reason="workers lost; requeued to resume from checkpoint",
            event=Event("lost", "the backend no longer runs this job's workers"),
        )
    joined: set[int] = set()
    newly_failed = store.sync_workers(job.id, status.workers, now, joined)
    _record_reports(effects, job, status, now)
    if status.finished:
        # Nothing left to stop: this releases what the backend still holds for the job.
        effects.call(job.id, "stop", lambda: backend.stop(job.id))
        end_workers(effects, job.id, now)
        store.update_job(
            job.id,
            now,
            slots=(),
            state=JobState.SUCCEEDED,
            reason="all workers finished",
            finished_at=now,
            scale_deadline=None,
            event=Event("succeeded", "all workers finished"),
        )
        return None
    if status.failed:
        effects.call(job.id, "stop", lambda: backend.stop(job.id))
        fail(effects, job, now, status.reason or "the backend reported the job failed")
        return None
    if newly_failed:
        return on_failures(effects, cluster, job, newly_failed, status, now, joined)
    restart_at = effects.restart_at.get(job.id)
    if restart_at is not None and now >= restart_at:
        # A crash loop's back-off is over: start the failed workers again.
        del effects.restart_at[job.id]
        slots = tuple(s for s in job.slots if cluster.has_slot(s))
        effects.call(job.id, "assign", lambda: backend.assign(job.id, slots))
    changes: dict[str, Any] = {"attained_service": job.attained_service + elapsed * len(job.slots)}
    event = None
    if job.state is JobState.RESCALING and settled(
        job, status, lambda: store.previous_slots(job.id)
    ):
        stall = now - (job.rescale_started_at or now)
        effects.metrics.rescale_stall.observe(stall)
        changes.update(
            state=JobState.RUNNING,
            reason=f"running on {len(job.slots)} slot(s)",
            rescale_started_at=None,
        )
        workers = effects.model(job).workers_of(len(job.slots))
        event = Event("rescaled", f"now {workers} worker(s)", {"stall_s": stall})
    return store.update_job(job.id, now, event=event, **changes)


def settled(job: JobRecord, status: JobStatus, before: Callable[[], Sequence[Slot] | None]) -> bool:
    """Whether every slot the job was given runs a worker that joined, and no other slot
    does.

    Workers that never join a group (plain processes: ``launch_workers``) never report
    running: a job of them that only gave slots up (``before``: the slots it held until
    this rescale) is settled once the workers on those slots are gone.
    """
    alive = status.alive_slots()
    if alive != set(job.slots):
        return False
    running = {s for w in status.workers if w.state is WorkerState.RUNNING for s in w.held}
    if running:
        return running == set(job.slots)
    held = before()
    return held is not None and set(job.slots) <= set(held)


def _record_reports(effects: LoopEffects, job: JobRecord, status: JobStatus, now: float) -> None:
    """JobStore what the workers reported: metrics (``tidal.log_metrics``) and the newest
    goodput report, which the policy reads as the job's throughput model."""
    try:
        if status.metrics:
            effects.store.add_metrics_many(
                job.id, [(m.step, m.time, m.values) for m in status.metrics]
            )
        if status.goodput is not None:
            effects.store.set_goodput(job.id, status.goodput, now)
    except Exception:
        # Reports are for charts and the policy; losing one must not stop scheduling.
        log.exception("recording reports of %s failed", job.id)


def throughput_models(effects: LoopEffects, job_ids: Sequence[str]) -> dict[str, ThroughputModel]:
    """Each job's reported throughput model (jobs that reported none are absent); the
    jobs are active ones (the loop's)."""
    models: dict[str, ThroughputModel] = {}
    wanted = set(job_ids)
    for job_id, record in effects.store.goodput(states=ACTIVE_STATES).items():
        if job_id not in wanted:
            continue
        raw = record.report.get("model")
        if not isinstance(raw, Mapping):
            continue
        try:
            models[job_id] = model_from_dict(raw)
        except ValueError:
            log.warning("job %s reported an unreadable throughput model", job_id)
    return models
