"""Liveness: the one route that needs no token."""

from __future__ import annotations

from fastapi import APIRouter

import tidal
from tidal.controller.routes.errors import DocumentedRoute
from tidal.wire.schema import HealthView

__all__ = ["router"]

router = APIRouter(tags=["meta"], route_class=DocumentedRoute)


@router.get("/health", response_model=HealthView)
async def health() -> HealthView:
    """Liveness; needs no token."""
    return HealthView(status="ok", version=tidal.__version__)
