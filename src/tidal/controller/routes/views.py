"""The API's views of stored records: the one conversion of each record into its view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidal.controller.store.jobs import AllocationRecord, EventRecord, GoodputRecord, JobRecord
from tidal.controller.store.pages import UnreadableJob
from tidal.controller.store.requests import PendingRequest, apply_requests, request_to_row
from tidal.wire.cluster import UtilisationPoint
from tidal.wire.schema import AllocationView, EventView, JobView, RequestView, WorkerCountView

__all__ = [
    "UNREADABLE",
    "allocation_view",
    "event_view",
    "job_view",
    "unreadable_view",
    "utilisation",
]

#: The state the listing shows for a job whose stored row cannot be read.
UNREADABLE = "unreadable"


def _number(report: Mapping[str, Any] | None, key: str) -> float | None:
    value = None if report is None else report.get(key)
    return float(value) if isinstance(value, int | float) else None


def worker_counts(
    job: JobRecord, min_slots: int, max_slots: int, target_slots: int | None
) -> WorkerCountView | None:
    """The job's size in workers: its slots now, its bounds and its target, each as the
    workers that many slots run (a one-role job's from its spec alone, without building
    its model: listing jobs stays cheap); ``None`` for a spec this release cannot read."""
    spec = job.spec_data
    if "roles" not in spec:
        resources = spec.get("resources")
        gpus = resources.get("gpus", 0) if isinstance(resources, Mapping) else 0
        per = max(1, gpus) if isinstance(gpus, int) else 1

        def count(slots: int) -> int:
            return slots // per

    else:
        try:
            model = job.job
        except ValueError:  # a stored spec this release cannot read: no roles to count by
            return None
        per = model.role.resources.slots
        count = model.workers_of
    return WorkerCountView(
        now=count(len(job.slots)),
        min=count(min_slots),
        max=count(max_slots),
        target=None if target_slots is None else count(target_slots),
        slots_per_worker=per,
    )


def job_view(
    job: JobRecord,
    goodput: GoodputRecord | None = None,
    pending: Sequence[PendingRequest] = (),
    with_spec: bool = True,
) -> JobView:
    """``job`` as the API shows it: with the values its ``pending`` requests ask for
    (what the loop will apply on its next tick), and its newest goodput report's numbers;
    without its spec unless ``with_spec`` (the listing's summary view)."""
    report = goodput.report if goodput is not None else None
    batch = _number(report, "batch_size")
    # Without requests nothing changes, and working that out needs the job's model.
    asked = apply_requests(job, pending).changes if pending else {}
    min_slots = asked.get("min_slots", job.min_slots)
    max_slots = asked.get("max_slots", job.max_slots)
    target_slots = asked.get("target_slots", job.target_slots)
    # model_construct: the store's data is already valid, and validating every field of
    # every job again made listing jobs the API's slowest call.
    return JobView.model_construct(
        id=job.id,
        name=job.name,
        owner=job.owner,
        team=job.team,
        state=job.state.value,
        reason=job.reason,
        priority=asked.get("priority", job.priority),
        workers=len(job.slots),
        min_slots=min_slots,
        max_slots=max_slots,
        target_slots=target_slots,
        slots=list(job.slots),
        restarts=job.restarts,
        reallocations=job.reallocations,
        generation=job.reallocations,
        labels=dict(job.labels),
        target_group=job.target_group,
        cancel_requested=asked.get("cancel_requested", job.cancel_requested),
        scale_deadline=asked.get("scale_deadline", job.scale_deadline),
        pending_requests=[_request_view(p) for p in pending],
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        spec=dict(job.spec_data) if with_spec else None,
        batch_size=int(batch) if batch is not None else None,
        efficiency=_number(report, "efficiency"),
        speedup=_number(report, "speedup"),
        worker_counts=worker_counts(job, min_slots, max_slots, target_slots),
    )


def unreadable_view(job: UnreadableJob) -> JobView:
    """A job whose stored row cannot be read, as the listing shows it in its place: state
    ``unreadable`` and the reason, so one bad row never hides the others."""
    return JobView.model_construct(
        id=job.id,
        name=job.name,
        state=UNREADABLE,
        reason=f"stored record cannot be read: {job.error}",
        priority=0,
        workers=0,
        min_slots=0,
        max_slots=0,
        target_slots=None,
        slots=[],
        restarts=0,
        reallocations=0,
        generation=0,
        labels={},
        target_group=None,
        cancel_requested=False,
        scale_deadline=None,
        pending_requests=[],
        submitted_at=job.submitted_at,
        started_at=None,
        finished_at=None,
        updated_at=job.submitted_at,
        spec=None,
        owner="",
        team="",
        batch_size=None,
        efficiency=None,
        speedup=None,
        worker_counts=None,
    )


def _request_view(pending: PendingRequest) -> RequestView:
    kind, data = request_to_row(pending.request)
    return RequestView(id=pending.id, time=pending.time, kind=kind, data=data)


def event_view(e: EventRecord) -> EventView:
    """An event as the API shows it."""
    return EventView(
        id=e.id,
        job_id=e.job_id,
        time=e.time,
        kind=e.kind,
        message=e.message,
        data=dict(e.data),
        actor=e.actor,
        source=e.source,
    )


def allocation_view(a: AllocationRecord) -> AllocationView:
    """A point of the allocation timeline as the API shows it."""
    return AllocationView(job_id=a.job_id, time=a.time, count=a.count, slots=list(a.slots))


def utilisation(records: Sequence[AllocationRecord], total: int) -> list[UtilisationPoint]:
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
