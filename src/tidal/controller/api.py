"""The REST API over the controller: jobs, logs, events, allocations, cluster, metrics.

Handlers record what users ask for (a job, a priority, a target size, a cancel request);
the controller loop carries it out on its next tick. Every route but ``/health`` needs the
admin bearer token. The same app serves the web dashboard (``tidal.dashboard``) at ``/``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import TypeAdapter

import tidal
from tidal.controller.auth import BearerAuth
from tidal.controller.limits import install_request_guards, off_loop
from tidal.controller.logs import LogFollower, tail_lines
from tidal.controller.loop import Controller
from tidal.controller.schema import (
    AllocationView,
    ClusterView,
    EventView,
    HealthView,
    HostView,
    JobDetail,
    JobProgress,
    JobView,
    MetricsReport,
    MetricsView,
    PriorityRequest,
    ScaleByRequest,
    ScaleRequest,
    SpecCheck,
    SpecProblem,
    UtilisationPoint,
    WorkerView,
)
from tidal.controller.store import (
    ACTIVE_STATES,
    AllocationRecord,
    Event,
    EventRecord,
    GoodputRecord,
    JobRecord,
    JobState,
    JobStateError,
)
from tidal.dashboard import mount_dashboard
from tidal.spec import JobSpec, SpecError, locate_problems, parse_spec_json, parse_spec_yaml

__all__ = ["create_app"]

#: Spelled out: the status constant's name differs between Starlette versions.
_UNPROCESSABLE = 422
_JOB_LIST = TypeAdapter(list[JobView])
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
#: How often a followed log is checked for new lines.
_FOLLOW_POLL_S = 0.25


def _number(report: Mapping[str, Any] | None, key: str) -> float | None:
    value = None if report is None else report.get(key)
    return float(value) if isinstance(value, int | float) else None


def _job_view(job: JobRecord, goodput: GoodputRecord | None = None) -> JobView:
    report = goodput.report if goodput is not None else None
    batch = _number(report, "batch_size")
    # model_construct: the store's data is already valid, and validating every field of
    # every job again made listing jobs the API's slowest call.
    return JobView.model_construct(
        id=job.id,
        name=job.name,
        state=job.state.value,
        reason=job.reason,
        priority=job.priority,
        workers=len(job.slots),
        min_workers=job.min_workers,
        max_workers=job.max_workers,
        target_workers=job.target_workers,
        slots=list(job.slots),
        restarts=job.restarts,
        generation=job.generation,
        labels=dict(job.labels),
        target_group=job.target_group,
        cancel_requested=job.cancel_requested,
        scale_deadline=job.scale_deadline,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        spec=dict(job.spec_data),
        batch_size=int(batch) if batch is not None else None,
        efficiency=_number(report, "efficiency"),
        speedup=_number(report, "speedup"),
    )


def _event_view(e: EventRecord) -> EventView:
    return EventView(
        id=e.id, job_id=e.job_id, time=e.time, kind=e.kind, message=e.message, data=dict(e.data)
    )


def _allocation_view(a: AllocationRecord) -> AllocationView:
    return AllocationView(job_id=a.job_id, time=a.time, count=a.count, slots=list(a.slots))


def _spec_loc(path: str) -> list[str | int]:
    parts = [p for p in path.replace("[", ".").replace("]", "").split(".") if p]
    return ["body", *[int(p) if p.isascii() and p.isdigit() and len(p) < 10 else p for p in parts]]


def _spec_problem_response(exc: SpecError) -> JSONResponse:
    detail = [
        {"loc": _spec_loc(path), "path": path, "msg": message, "type": "spec_error"}
        for path, message in exc.problems
    ]
    return JSONResponse(status_code=_UNPROCESSABLE, content={"detail": detail})


async def _spec_text(request: Request) -> tuple[str, bool]:
    """A request's body as text, and whether it is YAML (by content type) rather than JSON."""
    body = await request.body()
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    return body.decode("utf-8", errors="replace"), ctype in _YAML_TYPES


def _read_spec(text: str, is_yaml: bool) -> JobSpec:
    """The spec in a request body; raises :class:`SpecError`."""
    return parse_spec_yaml(text) if is_yaml else parse_spec_json(text)


def _utilisation(records: Sequence[AllocationRecord], total: int) -> list[UtilisationPoint]:
    """Slots held by all jobs together, one point per time the sum may have changed."""
    counts: dict[str, int] = {}
    points: list[UtilisationPoint] = []
    for a in records:
        counts[a.job_id] = a.count
        point = UtilisationPoint(time=a.time, used=sum(counts.values()), total=total)
        if points and points[-1].time == a.time:
            points[-1] = point  # several jobs changed in one tick: keep the sum after all
        else:
            points.append(point)
    return points


def _invalid(path: str, message: str) -> HTTPException:
    return HTTPException(
        status_code=_UNPROCESSABLE,
        detail=[{"loc": ["body", path], "path": path, "msg": message, "type": "value_error"}],
    )


def _parse_labels(raw: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HTTPException(
                status_code=_UNPROCESSABLE,
                detail=[
                    {
                        "loc": ["query", "label"],
                        "path": "label",
                        "msg": f"expected KEY=VALUE (got {item!r})",
                        "type": "value_error",
                    }
                ],
            )
        labels[key] = value
    return labels


def create_app(controller: Controller, token: str) -> FastAPI:
    """The API for ``controller``, admitting requests that carry ``token``."""
    store = controller.store
    app = FastAPI(
        title="tidal",
        version=tidal.__version__,
        description="Share a pool of GPUs among elastic PyTorch training jobs.",
    )
    app.state.controller = controller
    auth = BearerAuth(token)
    public = APIRouter()
    api = APIRouter(dependencies=[Depends(auth)])

    def job_or_404(ref: str) -> JobRecord:
        job = store.resolve(ref)
        if job is None:
            raise HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=f"no job {ref!r}")
        return job

    def change(job: JobRecord, **kwargs: Any) -> JobView:
        try:
            return _job_view(store.update_job(job.id, expect=ACTIVE_STATES, **kwargs))
        except JobStateError as exc:
            raise HTTPException(status_code=status.HTTP_409_CONFLICT, detail=str(exc)) from None

    @public.get("/health", response_model=HealthView, tags=["meta"])
    async def health() -> HealthView:
        """Liveness; needs no token."""
        return HealthView(status="ok", version=tidal.__version__)

    @api.post(
        "/jobs",
        status_code=status.HTTP_201_CREATED,
        response_model=JobView,
        tags=["jobs"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/yaml": {"schema": {"type": "string"}},
                },
            }
        },
    )
    async def submit(request: Request) -> Response:
        """Submit a job from a spec: JSON, or YAML text with ``Content-Type: application/yaml``."""
        try:
            spec = await off_loop(request, _read_spec, *await _spec_text(request))
        except SpecError as exc:
            return _spec_problem_response(exc)
        job = await run_in_threadpool(store.add_job, spec)
        return JSONResponse(
            status_code=status.HTTP_201_CREATED, content=_job_view(job).model_dump(mode="json")
        )

    @api.post(
        "/jobs/validate",
        response_model=SpecCheck,
        tags=["jobs"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/yaml": {"schema": {"type": "string"}},
                },
            }
        },
    )
    async def validate(request: Request) -> SpecCheck:
        """Check a spec without submitting it: every problem with its field path and, for
        YAML, the line it names (what the dashboard's submit page shows next to the text)."""
        text, is_yaml = await _spec_text(request)
        try:
            await off_loop(request, _read_spec, text, is_yaml)
        except SpecError as exc:
            lines = None
            if is_yaml:
                lines = await off_loop(request, locate_problems, text, exc.problems)
            return SpecCheck(
                valid=False,
                problems=[
                    SpecProblem(
                        loc=_spec_loc(path)[1:],
                        path=path,
                        msg=message,
                        line=lines[i] if lines is not None else None,
                    )
                    for i, (path, message) in enumerate(exc.problems)
                ],
            )
        return SpecCheck(valid=True, problems=[])

    @api.get("/jobs", response_model=list[JobView], tags=["jobs"])
    def list_jobs(
        state: Annotated[list[JobState] | None, Query()] = None,
        name: str | None = None,
        label: Annotated[list[str] | None, Query(description="KEY=VALUE, repeatable")] = None,
        limit: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    ) -> Response:
        """Jobs in submission order, filtered by state (repeatable), name and labels."""
        labels = _parse_labels(label or [])
        jobs = store.list_jobs(states=state, name=name, labels=labels, limit=limit)
        reports = store.goodput([j.id for j in jobs])
        # Serialised here in one go rather than re-validated item by item by FastAPI.
        body = _JOB_LIST.dump_json([_job_view(j, reports.get(j.id)) for j in jobs])
        return Response(content=body, media_type="application/json")

    @api.get("/jobs/{ref}", response_model=JobDetail, tags=["jobs"])
    def get_job(ref: str) -> JobDetail:
        """A job by id (or the latest job with that name), with its workers."""
        job = job_or_404(ref)
        workers = [
            WorkerView(
                worker_id=w.worker_id,
                host=w.slot[0],
                slot=w.slot[1],
                pid=w.pid,
                state=w.state.value,
                exit_code=w.exit_code,
            )
            for w in store.workers(job.id)
        ]
        report = store.goodput([job.id]).get(job.id)
        return JobDetail(
            **_job_view(job, report).model_dump(),
            worker_list=workers,
            goodput=dict(report.report) if report is not None else None,
        )

    @api.post("/jobs/{ref}/cancel", response_model=JobView, tags=["jobs"], status_code=202)
    def cancel(ref: str) -> JobView:
        """Ask for the job to be cancelled; its workers stop on the controller's next tick."""
        job = job_or_404(ref)
        return change(job, cancel_requested=True, event=Event("cancel_requested"))

    @api.put("/jobs/{ref}/priority", response_model=JobView, tags=["jobs"])
    def set_priority(ref: str, body: PriorityRequest) -> JobView:
        """Change the job's priority; the next allocation takes it into account."""
        job = job_or_404(ref)
        return change(
            job,
            priority=body.priority,
            event=Event(
                "priority",
                f"{job.priority} → {body.priority}",
                {"from": job.priority, "to": body.priority},
            ),
        )

    @api.post("/jobs/{ref}/scale", response_model=JobView, tags=["jobs"])
    def scale(ref: str, body: ScaleRequest) -> JobView:
        """Ask for exactly ``workers`` workers."""
        job = job_or_404(ref)
        if not job.min_workers <= body.workers <= job.max_workers:
            raise _invalid(
                "workers",
                f"must be within [{job.min_workers}, {job.max_workers}] (got {body.workers})",
            )
        return change(
            job,
            target_workers=body.workers,
            scale_deadline=None,
            scale_previous=None,
            event=Event("scale", f"target {body.workers} worker(s)", {"to": body.workers}),
        )

    @api.post("/jobs/{ref}/scale-out", response_model=JobView, tags=["jobs"])
    def scale_out(ref: str, body: ScaleByRequest) -> JobView:
        """Grow by ``count`` workers; with ``timeout_s``, rolled back if not reached in time."""
        job = job_or_404(ref)
        if not job.state.holds_slots:
            raise HTTPException(status_code=409, detail=f"job {job.id} is {job.state.value}")
        target = len(job.slots) + body.count
        if target > job.max_workers:
            raise _invalid(
                "count",
                f"would make {target} workers, above the job's max of {job.max_workers}",
            )
        deadline = time.time() + body.timeout_s if body.timeout_s else None
        return change(
            job,
            target_workers=target,
            scale_previous=job.target_workers,
            scale_deadline=deadline,
            event=Event("scale_out", f"target {target} worker(s)", {"to": target}),
        )

    @api.post("/jobs/{ref}/scale-in", response_model=JobView, tags=["jobs"])
    def scale_in(ref: str, body: ScaleByRequest) -> JobView:
        """Shrink by ``count`` workers."""
        job = job_or_404(ref)
        if not job.state.holds_slots:
            raise HTTPException(status_code=409, detail=f"job {job.id} is {job.state.value}")
        target = len(job.slots) - body.count
        if target < job.min_workers:
            raise _invalid(
                "count",
                f"would leave {target} workers, below the job's min of {job.min_workers}",
            )
        return change(
            job,
            target_workers=target,
            scale_previous=None,
            scale_deadline=None,
            event=Event("scale_in", f"target {target} worker(s)", {"to": target}),
        )

    @api.get("/jobs/{ref}/events", response_model=list[EventView], tags=["jobs"])
    def job_events(
        ref: str, limit: Annotated[int, Query(ge=1, le=10000)] = 1000
    ) -> list[EventView]:
        """The job's events in time order."""
        job = job_or_404(ref)
        return [_event_view(e) for e in store.events(job.id, limit=limit)]

    @api.get("/jobs/{ref}/allocations", response_model=list[AllocationView], tags=["jobs"])
    def job_allocations(ref: str) -> list[AllocationView]:
        """The job's allocation timeline."""
        job = job_or_404(ref)
        return [_allocation_view(a) for a in store.allocations(job.id)]

    @api.post("/jobs/{ref}/metrics", status_code=204, tags=["jobs"])
    def report_metrics(ref: str, body: MetricsReport) -> Response:
        """Record a job's training metrics at one step (for training curves)."""
        job = job_or_404(ref)
        store.add_metrics(job.id, body.step, body.values)
        return Response(status_code=204)

    @api.get("/jobs/{ref}/metrics", response_model=list[MetricsView], tags=["jobs"])
    def job_metrics(ref: str) -> list[MetricsView]:
        """The job's training metrics in step order."""
        job = job_or_404(ref)
        return [
            MetricsView(step=m.step, time=m.time, values=dict(m.values))
            for m in store.metrics(job.id)
        ]

    @api.get(
        "/jobs/{ref}/logs",
        tags=["jobs"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def logs(
        ref: str,
        tail: Annotated[int, Query(ge=0, le=100_000)] = 100,
        worker: int | None = None,
        follow: bool = False,
    ) -> Response:
        """The last ``tail`` lines of each worker's log, each line prefixed ``[worker]``;
        ``follow`` keeps streaming new lines until the job ends."""
        job = await run_in_threadpool(job_or_404, ref)

        def paths() -> dict[int, Any]:
            found = controller.log_paths(job.id)
            return {k: v for k, v in found.items() if worker is None or k == worker}

        initial = paths()
        if worker is not None and not initial:
            raise HTTPException(status_code=404, detail=f"no log for worker {worker}")
        head = [
            f"[{wid}] {line}\n"
            for wid, path in sorted(initial.items())
            for line in tail_lines(path, tail)
        ]
        if not follow:
            return PlainTextResponse("".join(head))

        async def stream() -> AsyncIterator[str]:
            follower = LogFollower(initial)
            for line in head:
                yield line
            while True:
                current = await run_in_threadpool(store.get_job, job.id)
                done = current is None or current.state.terminal
                for wid, line in follower.read(paths()):
                    yield f"[{wid}] {line}\n"
                if done:
                    return
                await asyncio.sleep(_FOLLOW_POLL_S)

        return StreamingResponse(stream(), media_type="text/plain")

    @api.get("/events", response_model=list[EventView], tags=["cluster"])
    def events(
        job: str | None = None,
        since: float | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> list[EventView]:
        """Events of all jobs (and the controller's own) in time order."""
        return [_event_view(e) for e in store.events(job, since=since, limit=limit)]

    @api.get("/allocations", response_model=list[AllocationView], tags=["cluster"])
    def allocations(since: float | None = None) -> list[AllocationView]:
        """The allocation timeline of every job: what charts draw."""
        return [_allocation_view(a) for a in store.allocations(since=since)]

    @api.get("/cluster", response_model=ClusterView, tags=["cluster"])
    def cluster() -> ClusterView:
        """Hosts, slots and who holds them."""
        owner = {
            slot: j.id
            for j in store.list_jobs(states=[JobState.RUNNING, JobState.RESCALING])
            for slot in j.slots
        }
        hosts = [
            HostView(
                name=h.name,
                slots=h.slots,
                gpu=h.gpu,
                group=h.group,
                labels=dict(h.labels),
                used_by=[owner.get((h.name, i)) for i in range(h.slots)],
            )
            for h in controller.cluster.hosts
        ]
        return ClusterView(
            policy=getattr(controller.policy, "name", type(controller.policy).__name__),
            total_slots=controller.cluster.total_slots,
            used_slots=len(owner),
            hosts=hosts,
        )

    @api.get("/cluster/utilisation", response_model=list[UtilisationPoint], tags=["cluster"])
    def utilisation(since: float | None = None) -> list[UtilisationPoint]:
        """Slots in use over time (a step series): the cluster page's chart."""
        points = _utilisation(store.allocations(), controller.cluster.total_slots)
        if since is None:
            return points
        # The level at ``since`` is the last point before it, moved to ``since``.
        before = [p for p in points if p.time < since]
        after = [p for p in points if p.time >= since]
        if before:
            after.insert(0, before[-1].model_copy(update={"time": since}))
        return after

    @api.get("/progress", response_model=list[JobProgress], tags=["jobs"])
    def progress() -> list[JobProgress]:
        """Each job's latest training metrics: what the jobs table shows as progress."""
        return [
            JobProgress(job_id=m.job_id, step=m.step, time=m.time, values=dict(m.values))
            for m in store.latest_metrics()
        ]

    @api.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus exposition: slots, jobs by state, rescales, rescale stalls."""
        body, content_type = controller.metrics.render()
        return Response(content=body, media_type=content_type)

    app.include_router(public)
    app.include_router(api)
    mount_dashboard(app, auth)
    install_request_guards(app)
    return app
