"""Resizing a job: to a size, by a count (``scale-out`` / ``scale-in``), or a multi-role
job's elastic role to a number of replicas.

Like every change to a job, a resize is a request the controller loop carries out on its
next tick (:mod:`tidal.controller.store.requests`): these routes check it against the job's
bounds and record it.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException

from tidal.controller.access import Principal
from tidal.controller.routes.auth import PrincipalDep
from tidal.controller.routes.deps import JobStoreDep, invalid, job_or_404
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.routes.jobs import ask
from tidal.controller.store.jobs import Event, JobRecord, JobStore
from tidal.controller.store.requests import Resize
from tidal.wire.schema import JobView, ScaleByRequest, ScaleRequest

__all__ = ["router"]

router = APIRouter(tags=["jobs"], route_class=ProtectedRoute)


def _holding(job: JobRecord) -> None:
    if not job.state.holds_slots:
        raise HTTPException(status_code=409, detail=f"job {job.id} is {job.state.value}")


def _width(job: JobRecord) -> int:
    """Slots one worker of the job's scaling role holds (its GPUs; 1 when the stored spec
    cannot be read): the requests below count workers, the job's bounds count slots."""
    try:
        return job.job.role.resources.slots
    except ValueError:
        return 1


def _workers(job: JobRecord, slots: int) -> int:
    """``slots`` of ``job`` as a count of workers, as users count them."""
    try:
        return job.job.workers_of(slots)
    except ValueError:  # a stored spec this release cannot read: one worker a slot
        return slots


@router.post("/jobs/{ref}/scale", response_model=JobView)
def scale(ref: str, body: ScaleRequest, store: JobStoreDep, who: PrincipalDep) -> JobView:
    """Ask for exactly ``workers`` workers (of ``role``, when given)."""
    job = job_or_404(store, ref)
    if body.role is not None:
        return _scale_role(store, job, body.role, body.workers, who)
    if _width(job) > 1:
        # Workers of several slots each: ``workers`` counts replicas, not slots.
        return _scale_role(store, job, job.job.role.name, body.workers, who)
    if not job.min_slots <= body.workers <= job.max_slots:
        raise invalid(
            "workers",
            f"must be within [{job.min_slots}, {job.max_slots}] (got {body.workers})",
        )
    return ask(
        store,
        job,
        Resize(body.workers, "scale"),
        Event("scale", f"target {body.workers} worker(s)", {"to": body.workers}),
        who,
    )


def _scale_role(
    store: JobStore, job: JobRecord, role_name: str, replicas: int, who: Principal
) -> JobView:
    """A job's slots are its fixed roles' replicas plus its elastic role's: asking the
    elastic role for ``replicas`` asks the job for that many plus the fixed ones."""
    try:
        model = job.job
    except ValueError:  # a stored spec this release cannot read has no roles to scale
        raise invalid("role", f"job {job.id}'s spec cannot be read; scale it by workers") from None
    names = [r.name for r in model.roles]
    if role_name not in names:
        raise invalid("role", f"job {job.id} has no role {role_name!r} (it has {names})")
    role = model.role_named(role_name)
    if not role.replicas.elastic:
        raise invalid(
            "role",
            f"role {role_name} has a fixed size of {role.replicas.max}; "
            "only a job's elastic role scales",
        )
    low, high = role.replicas.min, role.replicas.max
    if not low <= replicas <= high:
        raise invalid("workers", f"must be within [{low}, {high}] for role {role_name}")
    target = model.slots_for(replicas)
    workers = model.workers_of(target)
    held = "" if workers == target else f", {target} slots"
    return ask(
        store,
        job,
        Resize(target, "scale"),
        Event(
            "scale",
            f"target {replicas} replica(s) of {role_name} ({workers} worker(s) in all{held})",
            {"to": target, "role": role_name, "replicas": replicas},
        ),
        who,
    )


@router.post("/jobs/{ref}/scale-out", response_model=JobView)
def scale_out(ref: str, body: ScaleByRequest, store: JobStoreDep, who: PrincipalDep) -> JobView:
    """Grow by ``count`` workers; with ``timeout_s``, rolled back if not reached in time."""
    job = job_or_404(store, ref)
    _holding(job)
    width = _width(job)
    target = len(job.slots) + body.count * width
    if target > job.max_slots:
        raise invalid(
            "count",
            f"would make {_workers(job, target)} workers, above the job's max of "
            f"{_workers(job, job.max_slots)}",
        )
    deadline = time.time() + body.timeout_s if body.timeout_s else None
    return ask(
        store,
        job,
        Resize(target, "scale_out", deadline),
        Event("scale_out", f"target {_workers(job, target)} worker(s)", {"to": target}),
        who,
    )


@router.post("/jobs/{ref}/scale-in", response_model=JobView)
def scale_in(ref: str, body: ScaleByRequest, store: JobStoreDep, who: PrincipalDep) -> JobView:
    """Shrink by ``count`` workers."""
    job = job_or_404(store, ref)
    _holding(job)
    width = _width(job)
    target = len(job.slots) - body.count * width
    if target < job.min_slots:
        raise invalid(
            "count",
            f"would leave {_workers(job, target)} workers, below the job's min of "
            f"{_workers(job, job.min_slots)}",
        )
    return ask(
        store,
        job,
        Resize(target, "scale_in"),
        Event("scale_in", f"target {_workers(job, target)} worker(s)", {"to": target}),
        who,
    )
