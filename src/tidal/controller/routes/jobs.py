"""Jobs: submit, validate, list and read them, and ask for changes (priority, size, cancel).

A change is recorded as a request the controller loop applies on its next tick; the answer
is the job's view showing what was asked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, replace
from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import Field, TypeAdapter

from tidal.controller.access import Principal, priority_refusal, submit_team
from tidal.controller.cluster import ClusterModel
from tidal.controller.routes.auth import PrincipalDep
from tidal.controller.routes.deps import ControllerDep, JobStoreDep, invalid, job_or_404
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.routes.job_status import RoleStatus, conditions, role_statuses
from tidal.controller.routes.limits import off_loop
from tidal.controller.routes.spec_body import (
    SPEC_BODY,
    parse_spec_body,
    spec_loc,
    spec_problem_response,
    spec_text,
)
from tidal.controller.routes.views import allocation_view, event_view, job_view, unreadable_view
from tidal.controller.store.change_cache import ChangeCache
from tidal.controller.store.jobs import Event, JobRecord, JobStore
from tidal.controller.store.pages import Cursor, CursorError, UnreadableJob
from tidal.controller.store.records import WorkerRecord
from tidal.controller.store.requests import Cancel, PendingRequest, SetPriority, UserRequest
from tidal.controller.support import Capabilities, capabilities_of
from tidal.model_states import ACTIVE_STATES, JobState, JobStateError
from tidal.spec import SpecError
from tidal.spec_lines import locate_problems
from tidal.wire.schema import (
    AllocationView,
    ConditionView,
    EventView,
    JobDetail,
    JobView,
    PriorityRequest,
    RoleStatusView,
    SpecCheck,
    SpecProblem,
    SpecWarning,
    Submitted,
    WorkerView,
)

__all__ = ["ask", "fresh", "router"]

router = APIRouter(tags=["jobs"], route_class=ProtectedRoute)

#: Jobs per listing page unless the client asks for another size, and the most it may.
DEFAULT_PAGE = 100
MAX_PAGE = 1000

ListView = Literal["summary", "full"]
#: A label filter, ``KEY=VALUE`` (the schema says so: a value without ``=`` is a 422).
_Label = Annotated[str, Field(pattern=r"^[^=]+=")]
_JOB = TypeAdapter(JobView)


def _parse_labels(raw: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise invalid("label", f"expected KEY=VALUE (got {item!r})", where="query")
        labels[key] = value
    return labels


def _can(request: Request) -> Capabilities:
    """What the server's backend runs."""
    return capabilities_of(request.app.state.controller.backend)


def _cluster(request: Request) -> ClusterModel:
    """The hosts the server hands out now."""
    cluster: ClusterModel = request.app.state.controller.cluster
    return cluster


def fresh(store: JobStore, job: JobRecord) -> tuple[JobRecord, list[PendingRequest]]:
    """``job`` read again, with its requests still pending.

    The pending requests are read first: the loop applies a request and deletes it in
    one transaction, so a request applied in between is in the record read after it.
    Read the other way round, it is in neither (a priority just set showed the old one).
    """
    pending = store.pending_requests([job.id]).get(job.id, [])
    return store.get_job(job.id) or job, pending


def _current(store: JobStore, job: JobRecord) -> JobView:
    """The job's view with every request still pending."""
    current, pending = fresh(store, job)
    return job_view(current, None, pending)


def ask(
    store: JobStore, job: JobRecord, request: UserRequest, event: Event, who: Principal
) -> JobView:
    """Record ``request`` for the loop, and its event as ``who``'s; 409 when the job is
    over."""
    event = replace(event, actor=who.user, source=who.source)
    try:
        store.add_request(job.id, request, expect=ACTIVE_STATES, event=event)
    except JobStateError as exc:
        raise HTTPException(status_code=status.HTTP_409_CONFLICT, detail=str(exc)) from None
    return _current(store, job)


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=Submitted,
    openapi_extra=SPEC_BODY,
)
async def submit(request: Request, store: JobStoreDep, who: PrincipalDep) -> Response:
    """Submit a job from a spec: JSON, or YAML text with ``Content-Type: application/yaml``.
    The job is the caller's, in the caller's team (an admin may name another: ``team``)."""
    try:
        spec, warnings = await parse_spec_body(
            request, *await spec_text(request), _can(request), _cluster(request)
        )
    except SpecError as exc:
        return spec_problem_response(exc)
    team, team_refusal = submit_team(who, spec.team)
    refusal = priority_refusal(who, spec.priority) or team_refusal
    if refusal is not None:
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=refusal)
    job = await run_in_threadpool(
        partial(store.add_job, owner=who.user, team=team, source=who.source), spec
    )
    # Built from the stored job without validating it again (as the listing's views are).
    view = Submitted.model_construct(
        **dict(job_view(job)), warnings=[SpecWarning(path=p, msg=m) for p, m in warnings]
    )
    return Response(
        status_code=status.HTTP_201_CREATED,
        content=view.model_dump_json(),
        media_type="application/json",
    )


@router.post("/jobs/validate", response_model=SpecCheck, openapi_extra=SPEC_BODY)
async def validate(request: Request) -> SpecCheck | Response:
    """Check a spec without submitting it: every problem with its field path and, for
    YAML, the line it names (what the dashboard's submit page shows next to the text).

    A request with no spec to check (an empty body, or a JSON body that is not an object)
    is malformed: 422, as ``POST /jobs`` answers it."""
    text, is_yaml = await spec_text(request)
    if not text.strip():
        return spec_problem_response(SpecError([("", "required: a job spec, in JSON or YAML")]))
    try:
        _, warnings = await parse_spec_body(
            request, text, is_yaml, _can(request), _cluster(request)
        )
    except SpecError as exc:
        if not is_yaml and all(path == "" for path, _ in exc.problems):
            return spec_problem_response(exc)  # not a JSON object: no spec at all
        lines = None
        if is_yaml:
            lines = await off_loop(request, locate_problems, text, exc.problems)
        return SpecCheck(
            valid=False,
            problems=[
                SpecProblem(
                    loc=spec_loc(path)[1:],
                    path=path,
                    msg=message,
                    line=lines[i] if lines is not None else None,
                )
                for i, (path, message) in enumerate(exc.problems)
            ],
        )
    return SpecCheck(
        valid=True, problems=[], warnings=[SpecWarning(path=p, msg=m) for p, m in warnings]
    )


@router.get(
    "/jobs",
    response_model=list[JobView],
    responses={304: {"description": "Not modified: the page the ETag names is unchanged."}},
)
def list_jobs(
    request: Request,
    store: JobStoreDep,
    state: Annotated[list[JobState] | None, Query()] = None,
    name: str | None = None,
    label: Annotated[list[_Label] | None, Query(description="KEY=VALUE, repeatable")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    after: Annotated[
        str | None, Query(max_length=1000, description="the previous page's next cursor")
    ] = None,
    view: Annotated[ListView, Query(description="summary: without the spec")] = "summary",
    since: Annotated[
        int | None,
        Query(ge=0, le=2**62, description="only the jobs changed after this X-Change-Cursor"),
    ] = None,
) -> Response:
    """A page of jobs in submission order, filtered by state (repeatable), name and labels.

    The next page's cursor is in the ``X-Next-Cursor`` header (and a ``Link: rel=next``),
    absent on the last page. The answer carries an ETag: sent back in ``If-None-Match``,
    an unchanged page answers 304 with no body.

    Every answer carries ``X-Change-Cursor``; sent back as ``since``, the answer lists only
    the jobs changed after it (in the order of their latest change, with a new cursor), so
    a client that polls reads what changed and not every job again.
    """
    labels = _parse_labels(label or [])
    try:
        cursor = Cursor.decode(after) if after is not None else None
    except CursorError as exc:
        raise invalid("after", str(exc), where="query") from None
    if since is not None and cursor is not None:
        raise invalid("since", "cannot be combined with after (got both)", where="query")
    full = view == "full"
    # Serialised here rather than re-validated item by item by FastAPI. Each job's JSON is
    # kept until the job changes (a request or a report changes it too): only the jobs
    # changed since are made again, from their record, requests and report as one
    # snapshot of the store shows them.
    kept: ChangeCache[bytes] = request.app.state.job_views
    with store.snapshot():
        page = store.job_page(
            states=state, name=name, labels=labels, limit=limit, after=cursor, since=since
        )
        parts: dict[str, bytes | None] = {
            j.id: kept.get((j.id, full), page.changes[j.id]) for j in page.readable()
        }
        stale = [job_id for job_id, part in parts.items() if part is None]
        pending = store.pending_requests(stale) if stale else {}
        reports = store.goodput(stale) if stale else {}
    listed = []
    for j in page.jobs:
        if isinstance(j, UnreadableJob):
            listed.append(_JOB.dump_json(unreadable_view(j)))
            continue
        part = parts[j.id]
        if part is None:
            part = _JOB.dump_json(job_view(j, reports.get(j.id), pending.get(j.id, ()), full))
            kept.put((j.id, full), page.changes[j.id], part)
        listed.append(part)
    body = b"[" + b",".join(listed) + b"]"
    headers = {"ETag": f'"{hashlib.blake2b(body, digest_size=16).hexdigest()}"'}
    # Browsers revalidate with the ETag on every poll (and get 304 while nothing changed).
    headers["Cache-Control"] = "no-cache, private"
    headers["X-Change-Cursor"] = str(page.change)
    if page.next is not None:
        token = page.next.encode()
        headers["X-Next-Cursor"] = token
        headers["Link"] = f'<{request.url.include_query_params(after=token)}>; rel="next"'
    if headers["ETag"] in request.headers.get("if-none-match", ""):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(content=body, media_type="application/json", headers=headers)


@router.get("/jobs/{ref}", response_model=JobDetail)
def get_job(ref: str, controller: ControllerDep) -> Response:
    """A job by id (or the latest job with that name), with its workers and the IP
    address of each worker's host."""
    store = controller.store
    with store.snapshot():
        # One view of the store: the record and its pending requests agree (fresh's
        # second read is for reads in transactions of their own).
        job = job_or_404(store, ref)
        pending = store.pending_requests([job.id]).get(job.id, [])
        records = store.workers(job.id)
        report = store.goodput([job.id]).get(job.id)
        events = store.events(job.id)
    addresses = {h.name: h.address for h in controller.cluster.hosts}
    workers = [
        WorkerView(
            worker_id=w.worker_id,
            host=w.slot[0],
            slot=w.slot[1],
            pid=w.pid,
            state=w.state.value,
            exit_code=w.exit_code,
            ip_address=addresses.get(w.slot[0]),
            role=w.role,
            index=w.index,
            slots=[i for _, i in w.held],
        )
        for w in records
    ]
    detail = JobDetail(
        **job_view(job, report, pending).model_dump(),
        worker_list=workers,
        goodput=dict(report.report) if report is not None else None,
        roles=[RoleStatusView(**asdict(r)) for r in _role_statuses(job, records)],
        conditions=[
            ConditionView(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message,
                last_transition_time=c.time,
            )
            for c in conditions(job, events)
        ],
    )
    # Serialised here: a returned model would be validated again by FastAPI, in a second
    # hand-over to its thread pool.
    return Response(content=detail.model_dump_json(), media_type="application/json")


def _role_statuses(job: JobRecord, workers: Sequence[WorkerRecord]) -> list[RoleStatus]:
    # A stored spec no release can read still has a view (its state, its workers), just
    # no roles to count by.
    try:
        model = job.job
    except ValueError:  # pydantic's ValidationError, as the spec was stored
        return []
    return role_statuses(model, job, workers)


@router.post("/jobs/{ref}/cancel", response_model=JobView, status_code=202)
def cancel(ref: str, store: JobStoreDep, who: PrincipalDep) -> JobView:
    """Ask for the job to be cancelled; its workers stop on the controller's next tick."""
    job = job_or_404(store, ref)
    return ask(store, job, Cancel(), Event("cancel_requested"), who)


@router.put("/jobs/{ref}/priority", response_model=JobView)
def set_priority(ref: str, body: PriorityRequest, store: JobStoreDep, who: PrincipalDep) -> JobView:
    """Change the job's priority; the next allocation takes it into account. A member
    may set one within :data:`~tidal.controller.access.MEMBER_PRIORITIES`."""
    job = job_or_404(store, ref)
    refusal = priority_refusal(who, body.priority)
    if refusal is not None:
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=refusal)
    before = _current(store, job).priority
    return ask(
        store,
        job,
        SetPriority(body.priority),
        Event("priority", f"{before} → {body.priority}", {"from": before, "to": body.priority}),
        who,
    )


@router.get("/jobs/{ref}/events", response_model=list[EventView])
def job_events(
    ref: str, store: JobStoreDep, limit: Annotated[int, Query(ge=1, le=10000)] = 1000
) -> list[EventView]:
    """The job's events in time order."""
    job = job_or_404(store, ref)
    return [event_view(e) for e in store.events(job.id, limit=limit)]


@router.get("/jobs/{ref}/allocations", response_model=list[AllocationView])
def job_allocations(ref: str, store: JobStoreDep) -> list[AllocationView]:
    """The job's allocation timeline."""
    job = job_or_404(store, ref)
    return [allocation_view(a) for a in store.allocations(job.id)]
