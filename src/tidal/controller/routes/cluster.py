"""The cluster: hosts and who holds their slots, events, the allocation timeline and
utilisation over time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tidal.controller.loop.controller import Controller
from tidal.controller.loop.draining import DrainState
from tidal.controller.routes.deps import ControllerDep, JobStoreDep
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.routes.views import allocation_view, event_view, utilisation
from tidal.model_states import JobState
from tidal.wire.cluster import (
    CheckpointOrderView,
    ClusterView,
    HostDrainView,
    HostView,
    TeamQueueView,
    UtilisationPoint,
)
from tidal.wire.schema import AllocationView, EventView

__all__ = ["host_views", "router"]

router = APIRouter(tags=["cluster"], route_class=ProtectedRoute)


@router.get("/events", response_model=list[EventView])
def events(
    store: JobStoreDep,
    job: str | None = None,
    since: float | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    actor: Annotated[str | None, Query(max_length=80)] = None,
) -> list[EventView]:
    """Events of all jobs (and the controller's own) in time order; with ``actor``, the
    changes that user made only."""
    return [event_view(e) for e in store.events(job, since=since, limit=limit, actor=actor)]


@router.get("/allocations", response_model=list[AllocationView])
def allocations(store: JobStoreDep, since: float | None = None) -> list[AllocationView]:
    """The allocation timeline of every job: what charts draw."""
    return [allocation_view(a) for a in store.allocations(since=since)]


def host_views(controller: Controller) -> list[HostView]:
    """Every host, who holds its slots, and, while it drains, what is still on it."""
    holder = {
        slot: j.id
        for j in controller.store.list_jobs(states=[JobState.RUNNING, JobState.RESCALING])
        for slot in j.slots
    }
    return [
        HostView(
            name=h.name,
            slots=h.slots,
            gpu=h.gpu,
            group=h.group,
            labels=dict(h.labels),
            used_by=[holder.get((h.name, i)) for i in range(h.slots)],
            draining=_drain_view(controller.drains.state(h.name)),
        )
        for h in controller.cluster.hosts
    ]


def _drain_view(state: DrainState | None) -> HostDrainView | None:
    if state is None:
        return None
    return HostDrainView(
        requested_at=state.drain.requested_at,
        leaves_at=state.drain.leaves_at,
        source=state.drain.source.value,
        remaining=list(state.remaining),
        checkpoints=[
            CheckpointOrderView(job=o.job_id, at=o.at, deadline=o.deadline)
            for o in state.checkpoints
        ],
    )


@router.get("/cluster", response_model=ClusterView)
def cluster(controller: ControllerDep) -> ClusterView:
    """Hosts, slots and who holds them; draining hosts and what is still on them."""
    hosts = host_views(controller)
    return ClusterView(
        policy=getattr(controller.policy, "name", type(controller.policy).__name__),
        total_slots=controller.cluster.total_slots,
        used_slots=sum(1 for h in hosts for job in h.used_by if job is not None),
        hosts=hosts,
    )


@router.get("/queues", response_model=list[TeamQueueView])
def queues(controller: ControllerDep) -> list[TeamQueueView]:
    """Each team's queue: guaranteed slots, limit, and what it uses, borrows and lends
    (``tidal server --teams``; empty without teams)."""
    return [
        TeamQueueView(
            team=u.team,
            guaranteed=u.guaranteed,
            limit=u.limit,
            used=u.used,
            borrowed=u.borrowed,
            lent=u.lent,
        )
        for u in controller.teams.usage
    ]


@router.get("/cluster/utilisation", response_model=list[UtilisationPoint])
def cluster_utilisation(
    controller: ControllerDep, since: float | None = None
) -> list[UtilisationPoint]:
    """Slots in use over time (a step series): the cluster page's chart."""
    points = utilisation(controller.store.allocations(), controller.cluster.total_slots)
    if since is None:
        return points
    # The level at ``since`` is the last point before it, moved to ``since``.
    before = [p for p in points if p.time < since]
    after = [p for p in points if p.time >= since]
    if before:
        after.insert(0, before[-1].model_copy(update={"time": since}))
    return after
