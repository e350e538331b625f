"""Workers' logs: the tail of each, or followed until the job ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from tidal.controller.routes.deps import ControllerDep, job_or_404
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.routes.log_files import LogFollower, tail_lines

__all__ = ["router"]

router = APIRouter(tags=["jobs"], route_class=ProtectedRoute)
#: How often a followed log is checked for new lines.
_FOLLOW_POLL_S = 0.25


@router.get(
    "/jobs/{ref}/logs",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
async def logs(
    ref: str,
    request: Request,
    controller: ControllerDep,
    tail: Annotated[int, Query(ge=0, le=100_000)] = 100,
    worker: int | None = None,
    follow: bool = False,
) -> Response:
    """The last ``tail`` lines of each worker's log (from at most its last MiB; a line
    over 256 KiB cut and marked ``[…cut]``), each line prefixed ``[worker]``; ``follow``
    keeps streaming new lines until the job ends (or the server stops), across the logs'
    rotations."""
    store = controller.store
    job = await run_in_threadpool(job_or_404, store, ref)

    def paths() -> dict[int, Path]:
        found = controller.log_paths(job.id)
        return {k: v for k, v in found.items() if worker is None or k == worker}

    def head_lines(found: dict[int, Path]) -> list[str]:
        return [
            f"[{wid}] {line}\n"
            for wid, path in sorted(found.items())
            for line in tail_lines(path, tail)
        ]

    # Every file read runs in the threadpool: a log can be huge, the event loop serves
    # every other request (``/health`` included) meanwhile.
    initial = await run_in_threadpool(paths)
    if worker is not None and not initial:
        raise HTTPException(status_code=404, detail=f"no log for worker {worker}")
    head = await run_in_threadpool(head_lines, initial)
    if not follow:
        return PlainTextResponse("".join(head))

    def step(follower: LogFollower) -> list[tuple[int, str]]:
        return follower.read(paths())

    stopping = getattr(request.app.state, "stopping", None)

    async def stream() -> AsyncIterator[str]:
        follower = await run_in_threadpool(LogFollower, initial)
        try:
            for line in head:
                yield line
            while True:
                current = await run_in_threadpool(store.get_job, job.id)
                done = current is None or current.state.terminal
                for wid, line in await run_in_threadpool(step, follower):
                    yield f"[{wid}] {line}\n"
                if done or (stopping is not None and stopping.is_set()):
                    return
                await asyncio.sleep(_FOLLOW_POLL_S)
        finally:
            follower.close()

    return StreamingResponse(stream(), media_type="text/plain")
