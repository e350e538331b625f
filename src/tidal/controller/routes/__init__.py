"""The REST API over the controller, one router per resource.

``jobs`` (submit, list, requests to change a job), ``job_scaling`` (resize a job),
``job_workers`` (stop some of a job's workers), ``logs``, ``cluster`` (hosts, events,
allocations, utilisation), ``usage`` (every job's slots over time), ``host_drains``
(draining hosts, preemption notices), ``job_metrics`` (training metrics jobs report,
progress), ``prometheus`` (the controller's own metrics), ``registry`` (datasets and
models), ``training`` (a job from a model's form), ``users`` (users and their tokens) and
``health``.
Handlers read the store and record what users ask for as requests
(:mod:`tidal.controller.store.requests`); the controller loop carries them out on its next tick.
Every route but ``/health`` needs a user's token, and the user's role must allow it
(:mod:`~tidal.controller.routes.auth`); :func:`tidal.server.app.create_app`
puts the routers and the dashboard together.
"""

from __future__ import annotations

from fastapi import APIRouter

from tidal.controller.routes import (
    cluster,
    health,
    host_drains,
    job_metrics,
    job_scaling,
    job_workers,
    jobs,
    logs,
    prometheus,
    registry,
    training,
    usage,
    users,
)

__all__ = ["PROTECTED_ROUTERS", "PUBLIC_ROUTERS"]

#: Routers that need no token.
PUBLIC_ROUTERS: tuple[APIRouter, ...] = (health.router,)
#: Routers behind the bearer token.
PROTECTED_ROUTERS: tuple[APIRouter, ...] = (
    jobs.router,
    job_scaling.router,
    job_workers.router,
    logs.router,
    cluster.router,
    usage.router,
    host_drains.router,
    job_metrics.router,
    prometheus.router,
    registry.router,
    training.router,
    users.router,
)
