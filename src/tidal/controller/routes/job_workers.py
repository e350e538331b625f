"""A job's workers: stop some of them for good while the job goes on.

Like every change to a job, a stop is a request the controller loop carries out on its
next tick (:mod:`tidal.controller.store.requests`); whether it can be made is decided by
:func:`tidal.controller.loop.worker_stops.plan_stop`.
"""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, HTTPException

from tidal.controller.loop.worker_stops import StopRefused, plan_stop
from tidal.controller.routes.auth import PrincipalDep
from tidal.controller.routes.deps import JobStoreDep, invalid, job_or_404
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.routes.jobs import ask, fresh
from tidal.controller.store.jobs import Event
from tidal.controller.store.requests import apply_requests
from tidal.wire.schema import JobView, StopWorkersRequest

__all__ = ["router"]

router = APIRouter(tags=["jobs"], route_class=ProtectedRoute)


@router.post("/jobs/{ref}/workers/stop", response_model=JobView)
def stop_workers(
    ref: str, body: StopWorkersRequest, store: JobStoreDep, who: PrincipalDep
) -> JobView:
    """Stop the workers ``workers`` names; the job goes on without them, giving up exactly
    their slots (:mod:`tidal.controller.loop.worker_stops` says which workers can be stopped)."""
    job = job_or_404(store, ref)
    try:
        model = job.job
    except ValueError:  # a stored spec this release cannot read has no roles to check
        raise invalid("workers", f"job {job.id}'s spec cannot be read; cancel it") from None
    # Decided on the job as its pending requests leave it: two stops asked before the
    # loop applies either must not, together, go below what each alone respects.
    stored, pending = fresh(store, job)
    planned = replace(stored, **apply_requests(stored, pending).changes)
    if planned.cancel_requested:
        raise HTTPException(status_code=409, detail=f"job {job.id} is being cancelled")
    decision = plan_stop(planned, model, store.workers(job.id), body.workers)
    if isinstance(decision, StopRefused):
        if decision.status == 409:
            raise HTTPException(status_code=409, detail=f"{decision.field}: {decision.message}")
        raise invalid(decision.field, decision.message)
    stopped = ", ".join(str(w) for w in decision.worker_ids) or "none (already stopping)"
    return ask(
        store,
        job,
        decision,
        Event(
            "stop_workers",
            f"stop worker(s) {stopped}",
            {"workers": list(decision.worker_ids), "role": decision.role, "fixed": decision.fixed},
        ),
        who,
    )
