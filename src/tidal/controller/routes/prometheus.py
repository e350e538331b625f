"""The controller's own metrics for Prometheus to scrape (``GET /metrics``); the registry
is :class:`~tidal.controller.prometheus.ControllerMetrics`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from tidal.controller.routes.deps import ControllerDep
from tidal.controller.routes.errors import ProtectedRoute

__all__ = ["router"]

router = APIRouter(route_class=ProtectedRoute)


@router.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
def prometheus(controller: ControllerDep) -> Response:
    """Prometheus exposition: slots, jobs by state, rescales, rescale stalls."""
    body, content_type = controller.metrics.render()
    return Response(content=body, media_type=content_type)
