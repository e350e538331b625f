"""Draining hosts: an admin's drain and undrain, and a cloud's preemption notice.

A drained host gets no new workers and every job on it moves off at its next step
boundary (:mod:`tidal.policy.drain`); a job that cannot leave in place checkpoints before
the host goes. The notice route is the hook a cloud integration calls when it learns that
a machine will be taken ("host X goes at time T"): see ``examples/spot_notice.py``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException

from tidal.controller.loop.draining import UnknownHost
from tidal.controller.routes.cluster import host_views
from tidal.controller.routes.deps import ControllerDep
from tidal.controller.routes.errors import ErrorBody, ProtectedRoute
from tidal.controller.store.drains import DrainSource
from tidal.wire.cluster import DrainRequest, HostView, PreemptionNotice

__all__ = ["router"]

router = APIRouter(tags=["cluster"], route_class=ProtectedRoute)

_NO_HOST: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "The cluster has no host of that name."}
}


#: A drain without a body: no deadline.
_NO_DEADLINE = DrainRequest()


def _view(controller: ControllerDep, host: str) -> HostView:
    return next(h for h in host_views(controller) if h.name == host)


def _mark(
    controller: ControllerDep, host: str, leaves_at: float | None, source: DrainSource
) -> HostView:
    try:
        controller.drain_host(host, leaves_at=leaves_at, source=source)
    except UnknownHost:
        names = ", ".join(h.name for h in controller.cluster.hosts) or "none"
        raise HTTPException(404, f"no host {host!r} (hosts: {names})") from None
    return _view(controller, host)


@router.post("/cluster/hosts/{host}/drain", response_model=HostView, responses=_NO_HOST)
def drain(controller: ControllerDep, host: str, body: DrainRequest = _NO_DEADLINE) -> HostView:
    """Drain ``host``: no new workers, its jobs move off at their next step boundary; with
    a ``deadline`` (seconds), a job that cannot leave in place checkpoints before it."""
    deadline = body.deadline
    leaves_at = None if deadline is None else time.time() + deadline
    return _mark(controller, host, leaves_at, DrainSource.ADMIN)


@router.post("/cluster/hosts/{host}/undrain", response_model=HostView, responses=_NO_HOST)
def undrain(controller: ControllerDep, host: str) -> HostView:
    """Take ``host`` back into service: the policy may hand out its slots again."""
    if controller.cluster.host(host) is None and host not in controller.drains.drains():
        raise HTTPException(404, f"no host {host!r}")
    controller.undrain_host(host)
    return next((h for h in host_views(controller) if h.name == host), _gone(host))


@router.post("/cluster/hosts/{host}/notice", response_model=HostView, responses=_NO_HOST)
def notice(controller: ControllerDep, host: str, body: PreemptionNotice) -> HostView:
    """A preemption notice: ``host`` goes at ``at`` (seconds since the epoch). The host
    drains at once; a later notice may bring the time forward, never back."""
    return _mark(controller, host, body.at, DrainSource.NOTICE)


def _gone(host: str) -> HostView:
    """A host undrained after it left the cluster: nothing of it is left to show."""
    return HostView(name=host, slots=0, gpu=False, group=None, labels={}, used_by=[])
