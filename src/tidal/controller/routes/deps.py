"""What every route needs: the controller serving it and the job a path names."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse

from tidal.controller.loop.controller import Controller
from tidal.controller.store.jobs import JobRecord, JobStore, UnreadableJobError

__all__ = [
    "UNPROCESSABLE",
    "ControllerDep",
    "JobStoreDep",
    "invalid",
    "job_or_404",
    "unreadable_job_response",
]

#: Spelled out: the status constant's name differs between Starlette versions.
UNPROCESSABLE = 422


# Coroutines: FastAPI would run plain functions in its thread pool, one hand-over each.
async def _controller(request: Request) -> Controller:
    controller: Controller = request.app.state.controller
    return controller


async def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.controller.store
    return store


ControllerDep = Annotated[Controller, Depends(_controller)]
JobStoreDep = Annotated[JobStore, Depends(_store)]


def job_or_404(store: JobStore, ref: str) -> JobRecord:
    """The job ``ref`` names (an id, or the latest job of that name); 404 if none."""
    job = store.resolve(ref)
    if job is None:
        raise HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=f"no job {ref!r}")
    return job


def invalid(path: str, message: str, where: str = "body") -> HTTPException:
    """A 422 naming the field at fault, shaped like FastAPI's own validation errors."""
    return HTTPException(
        status_code=UNPROCESSABLE,
        detail=[{"loc": [where, path], "path": path, "msg": message, "type": "value_error"}],
    )


async def unreadable_job_response(_request: Request, exc: Exception) -> JSONResponse:
    """A route named a job whose stored row cannot be read: 409 saying so, with the
    decoding error (the listing shows the same job as ``unreadable``)."""
    assert isinstance(exc, UnreadableJobError)
    return JSONResponse(
        status_code=status.HTTP_409_CONFLICT,
        content={"detail": str(exc), "job": exc.job.id, "state": "unreadable"},
    )
