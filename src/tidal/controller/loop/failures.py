"""What the controller does when a job's workers fail: replace them, or fail the job.

The restart-or-fail decision is a pure function (:mod:`tidal.policy.restart`, shared with
``tidal run``); this module carries it out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from tidal.controller.cluster import ClusterModel
from tidal.controller.loop.effects import LoopEffects
from tidal.controller.store.jobs import Event, JobRecord
from tidal.launch.api import JobStatus, WorkerState, WorkerStatus
from tidal.model import Launcher
from tidal.model_states import JobState
from tidal.policy.restart import (
    Fail,
    LostWorker,
    Noop,
    Restart,
    RestartView,
    decide_restart,
)
from tidal.policy.role_restart import ReplicaExit, RoleRule, sort_exits

__all__ = ["end_workers", "fail", "on_failures", "with_causes"]


def on_failures(
    effects: LoopEffects,
    cluster: ClusterModel,
    job: JobRecord,
    failed: Sequence[WorkerStatus],
    status: JobStatus,
    now: float,
    joined: Collection[int] = (),
) -> JobRecord | None:
    """Replace ``failed`` workers on the job's slots, or fail the job once its restart
    budget is spent (:func:`~tidal.policy.restart.decide_restart`); the job as it is now,
    or ``None`` once it is over. ``joined``: the ids of those that had joined their group
    (a failure of none of them is a failure before joining, counted for a crash loop)."""
    model = effects.model(job)
    role = model.role
    limit = role.restart.max_restarts
    rules = {r.name: RoleRule(r.restart.policy.value, r.ends_job) for r in model.roles}
    exits = [ReplicaExit(w.role, w.index, w.exit_code) for w in failed]
    fatal, retry = sort_exits(rules, exits)
    if fatal is not None:
        effects.call(job.id, "stop", lambda: effects.backend.stop(job.id))
        fail(effects, job, now, with_causes(fatal, failed))
        return None
    # Finished replicas and ones a role leaves down (Never, not needed) are no failures.
    failed = [failed[i] for i in retry]
    # Only running workers hold the training state (a starting one has none yet).
    running = any(w.state is WorkerState.RUNNING for w in status.workers)
    before_join = not any(w.worker_id in joined for w in failed)
    cause = _first_cause(failed)
    view = RestartView(
        max_restarts=limit,
        restarts=job.restarts,
        group_gone=not running,
        # torchrun's way: a failure restarts every worker (the backend's group does it).
        whole_group=role.launcher.restart_based and len(model.roles) == 1,
        before_join=before_join,
        cause=cause,
        loop_count=_loop_count(effects, job.id, cause) + 1 if before_join else 1,
        torchrun=role.launcher is Launcher.TORCHRUN,
    )
    # An exit 0 to restart (policy Always) is a restart like any other here.
    lost = [LostWorker(str(w.worker_id), w.slot[0], w.exit_code or None) for w in failed]
    decision = decide_restart(view, lost)
    if isinstance(decision, Noop):
        return job
    if isinstance(decision, Fail):
        effects.call(job.id, "stop", lambda: effects.backend.stop(job.id))
        fail(effects, job, now, with_causes(decision.reason, failed), restarts=decision.restarts)
        return None
    # Same slots again: the backend starts a fresh worker on each slot without a live one.
    # Not on slots whose host left the cluster: the policy moves the job off them.
    slots = tuple(s for s in job.slots if cluster.has_slot(s))
    if decision.delay > 0:
        effects.restart_at[job.id] = now + decision.delay  # observe() starts them then
    else:
        effects.call(job.id, "assign", lambda: effects.backend.assign(job.id, slots))
    ids = ", ".join(decision.workers)
    return effects.store.update_job(
        job.id,
        now,
        state=JobState.RESCALING,
        restarts=decision.restarts,
        reallocations=job.reallocations + 1,
        rescale_started_at=now,
        reason=decision.reason,
        event=Event(
            "worker_failed",
            _failure_message(view, decision, failed),
            {
                "workers": ids,
                "exit_codes": list(decision.exit_codes),
                "restarts": decision.restarts,
                "before_join": before_join,
                "cause": cause,
                "loop_count": view.loop_count if before_join else 0,
            },
        ),
    )


def _failure_message(view: RestartView, decision: Restart, failed: Sequence[WorkerStatus]) -> str:
    """The ``worker_failed`` event's text: what was done, and the error."""
    if decision.delay > 0:
        return decision.reason  # a crash loop's reason names the error already
    if view.before_join:
        return with_causes(decision.reason, failed)
    ids = ", ".join(decision.workers)
    what = "restarting every worker" if view.whole_group else "replacing it"
    return with_causes(
        f"worker {ids} failed; {what} (restart {decision.restarts} of {view.max_restarts})",
        failed,
    )


def _first_cause(failed: Sequence[WorkerStatus]) -> str | None:
    """The error that ended the first of ``failed`` with one: its exception's line, else
    its exit status."""
    for w in failed:
        if w.cause:
            return w.cause
    codes = [w.exit_code for w in failed if w.exit_code is not None]
    return f"exit {codes[0]}" if codes else None


def _loop_count(effects: LoopEffects, job_id: str, cause: str | None) -> int:
    """Failures before joining in a row with ``cause`` so far: what the job's latest
    ``worker_failed`` event counted, if it failed before joining with the same error."""
    for event in reversed(effects.store.events(job_id, limit=20)):  # newest first
        if event.kind != "worker_failed":
            continue
        data = event.data or {}
        if data.get("before_join") and data.get("cause") == cause:
            count = data.get("loop_count")
            return count if isinstance(count, int) else 0
        return 0
    return 0


def with_causes(reason: str, failed: Sequence[WorkerStatus]) -> str:
    """``reason`` followed by the exceptions that ended the ``failed`` workers (each once),
    so the job's events say why, not only that, a worker failed."""
    causes = list(dict.fromkeys(w.cause for w in failed if w.cause))
    return reason if not causes else f"{reason}: {'; '.join(causes)}"


def end_workers(effects: LoopEffects, job_id: str, now: float) -> None:
    """The job ended and its backend stops what still runs: no worker of it is shown
    ``starting`` or ``running`` any more (each such one is recorded ``released``)."""
    live = (WorkerState.STARTING, WorkerState.RUNNING)
    ended = [
        WorkerStatus(
            w.worker_id,
            w.slot,
            WorkerState.RELEASED,
            w.pid,
            w.exit_code,
            w.role,
            w.index,
            slots=w.slots,
        )
        for w in effects.store.workers(job_id)
        if w.state in live
    ]
    if ended:
        effects.store.sync_workers(job_id, ended, now)


def fail(effects: LoopEffects, job: JobRecord, now: float, reason: str, **changes: Any) -> None:
    """Mark the job failed for ``reason``, releasing its slots."""
    end_workers(effects, job.id, now)
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
