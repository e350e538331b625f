"""Training metrics: what jobs report at each step, and each job's latest progress."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from tidal.controller.access import Role
from tidal.controller.routes.auth import PrincipalDep
from tidal.controller.routes.deps import JobStoreDep, job_or_404
from tidal.controller.routes.errors import ProtectedRoute
from tidal.wire.schema import JobProgress, MetricsReport, MetricsView

__all__ = ["router"]

router = APIRouter(route_class=ProtectedRoute)


@router.post("/jobs/{ref}/metrics", status_code=204, tags=["jobs"])
def report_metrics(ref: str, body: MetricsReport, store: JobStoreDep) -> Response:
    """Record a job's training metrics at one step (for training curves)."""
    job = job_or_404(store, ref)
    store.add_metrics(job.id, body.step, body.values)
    return Response(status_code=204)


@router.get("/jobs/{ref}/metrics", response_model=list[MetricsView], tags=["jobs"])
def job_metrics(ref: str, store: JobStoreDep) -> list[MetricsView]:
    """The job's training metrics in step order."""
    job = job_or_404(store, ref)
    return [
        MetricsView(step=m.step, time=m.time, values=dict(m.values)) for m in store.metrics(job.id)
    ]


@router.get("/progress", response_model=list[JobProgress], tags=["jobs"])
def progress(store: JobStoreDep, who: PrincipalDep) -> list[JobProgress]:
    """Each job's latest training metrics: what the jobs table shows as progress (of the
    caller's team's jobs, for all but admins: metrics are the team's)."""
    team = None if who.role is Role.ADMIN else who.team
    return [
        JobProgress(job_id=m.job_id, step=m.step, time=m.time, values=dict(m.values))
        for m in store.latest_metrics(team)
    ]
