"""The server's web app: the REST API's routers and the dashboard, on one port."""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import Depends, FastAPI

import tidal
from tidal.controller.credentials import ServerKey
from tidal.controller.loop.controller import Controller
from tidal.controller.routes import PROTECTED_ROUTERS, PUBLIC_ROUTERS
from tidal.controller.routes.auth import TokenAuth, TokenUse, register_data_dir_token
from tidal.controller.routes.deps import unreadable_job_response
from tidal.controller.routes.limits import install_request_guards
from tidal.controller.store.change_cache import ChangeCache
from tidal.controller.store.jobs import UnreadableJobError
from tidal.dashboard import mount_dashboard

__all__ = ["API_THREADS", "create_app"]

#: Threads that run the API's blocking routes (the store's reads and writes); more wait
#: their turn in arrival order. Under 50 clients, 8 gave the lowest p99 of every route
#: (40, anyio's default, left each thread a small share of the interpreter's lock and
#: the slowest request waited longest: docs/benchmarks.md).
API_THREADS = 8


def create_app(controller: Controller, token: str, key: ServerKey | None = None) -> FastAPI:
    """The API and dashboard for ``controller``, admitting the tokens of its store's users;
    ``token`` (the data dir's) is the user ``admin``'s. ``key`` hashes tokens for the store
    (the data dir's, :meth:`ServerKey.in_data_dir`; by default one kept in memory only)."""
    if not token:
        raise ValueError("an empty token would admit everyone")
    if key is None:
        key = ServerKey(secrets.token_bytes(32))
    register_data_dir_token(controller.store, key, token)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="tidal",
        version=tidal.__version__,
        description="Share a pool of GPUs among elastic PyTorch training jobs.",
    )
    app.state.controller = controller
    #: Each listed job's JSON, kept until the job changes (``GET /jobs``).
    app.state.job_views = ChangeCache[bytes]()
    #: Set when the server begins to shut down: open log streams end then, instead of
    #: holding the shutdown until they are cut.
    app.state.stopping = threading.Event()
    auth = TokenAuth(controller.store, key)
    app.state.auth = auth
    for router in PUBLIC_ROUTERS:
        app.include_router(router)
    for router in PROTECTED_ROUTERS:
        app.include_router(router, dependencies=[Depends(auth)])
    mount_dashboard(app, auth)
    app.add_exception_handler(UnreadableJobError, unreadable_job_response)
    install_request_guards(app, store_location=controller.store.location)
    app.add_middleware(TokenUse, auth=auth)
    return app
