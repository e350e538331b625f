"""The server's web app: the REST API's routers and the dashboard, on one port."""

from __future__ import annotations

from fastapi import Depends, FastAPI

import tidal
from tidal.controller.api import PROTECTED_ROUTERS, PUBLIC_ROUTERS
from tidal.controller.api.deps import unreadable_job_response
from tidal.controller.auth import BearerAuth
from tidal.controller.limits import install_request_guards
from tidal.controller.loop import Controller
from tidal.controller.store import UnreadableJobError
from tidal.dashboard import mount_dashboard

__all__ = ["create_app"]


def create_app(controller: Controller, token: str) -> FastAPI:
    """The API and dashboard for ``controller``, admitting requests that carry ``token``."""
    app = FastAPI(
        title="tidal",
        version=tidal.__version__,
        description="Share a pool of GPUs among elastic PyTorch training jobs.",
    )
    app.state.controller = controller
    auth = BearerAuth(token)
    for router in PUBLIC_ROUTERS:
        app.include_router(router)
    for router in PROTECTED_ROUTERS:
        app.include_router(router, dependencies=[Depends(auth)])
    mount_dashboard(app, auth)
    app.add_exception_handler(UnreadableJobError, unreadable_job_response)
    install_request_guards(app)
    return app
