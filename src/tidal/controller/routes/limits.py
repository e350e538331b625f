"""Guards every request passes: a bounded body, parsing off the event loop, no bare 500.

- **Body size.** A body larger than :data:`MAX_BODY_BYTES` is refused with 413 before it is
  read whole: at once when its ``Content-Length`` says so, else as soon as the bytes
  received pass the limit.
- **Parsing off the loop.** Parsing and validating a document is CPU work; on the event
  loop it would stall every other request (``/health`` included) for as long as it takes.
  :func:`off_loop` runs it in a worker thread, one document at a time: a flood of documents
  queues there (without a thread each) rather than taking the threads the synchronous routes
  need, and one parsing thread is all that competes with the loop for the interpreter.
- **Errors that echo the input.** A request refused by validation is answered with its
  problems, which quote what was sent: they are written as ASCII JSON, so text that cannot
  be encoded as UTF-8 (a lone surrogate, sent as ``"\\ud800"``) is escaped, not a 500.
- **A store that cannot be written.** A full disk answers 507, a read-only or unreachable
  store 503 (with ``Retry-After``), naming the cause and the file or database
  (:mod:`~tidal.controller.store.outage`); nothing was recorded. Reads go on as before.
  Logged as one line when the cause starts or changes, not a traceback a request.
- **Unhandled errors.** Any other exception no route handles is logged with its traceback
  and an error id, and answered with a JSON 500 carrying that id. Nothing is re-raised to
  the server, which would otherwise close the client's keep-alive connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidal.controller.store.outage import Outage, OutageKind, outage_of
from tidal.documents_bounds import SPEC_LIMITS

__all__ = [
    "MAX_BODY_BYTES",
    "AsciiJSONResponse",
    "BodySizeLimit",
    "ErrorResponses",
    "install_request_guards",
    "off_loop",
]

log = logging.getLogger(__name__)

#: The largest body any route takes: a job spec document (the other bodies are tiny).
MAX_BODY_BYTES = SPEC_LIMITS.max_bytes
#: Documents parsed at once; more wait (without a thread) for their turn. One: more
#: threads holding the interpreter lock by turns slowed the loop's answers (measured).
PARSERS = 1

_TOO_LARGE = 413
#: A full disk: the request may succeed once space is freed (WebDAV's status, RFC 4918).
INSUFFICIENT_STORAGE = 507
#: A store that is read-only or unreachable: try again later.
UNAVAILABLE = 503
#: Seconds a client is told to wait before trying again after a 503.
RETRY_AFTER_S = 5
#: The same outage is logged again at most this often (seconds).
_OUTAGE_LOG_EVERY_S = 60.0
T = TypeVar("T")


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status_code=_TOO_LARGE, detail=f"request body is larger than the {limit} bytes allowed"
    )


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: any text can be sent, even text (a lone
    surrogate) that UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        """``content`` as compact ASCII JSON."""
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


async def _validation_problems(request: Request, exc: Exception) -> Response:
    # FastAPI's own handler, but its UTF-8 rendering fails on input it quotes back.
    assert isinstance(exc, RequestValidationError)
    return AsciiJSONResponse(status_code=422, content={"detail": jsonable_encoder(exc.errors())})


class BodySizeLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, without reading it whole."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse at once on a declared length over the limit; else count what is read."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = _too_large(self.max_bytes)
            response = JSONResponse({"detail": error.detail}, status_code=_TOO_LARGE)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException: FastAPI passes it through whoever reads the body.
                    raise _too_large(self.max_bytes)
            return message

        await self.app(scope, limited, send)


class ErrorResponses:
    """ASGI middleware: an unhandled exception becomes a JSON answer: 507 or 503 for an
    outage of the store (``store_location`` names it), else a logged 500 with an error id."""

    def __init__(self, app: ASGIApp, store_location: str = "the store") -> None:
        self.app = app
        self.store_location = store_location
        self._logged: tuple[str, float] | None = None
        self._log_lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; on an exception before the response started, answer 500."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            outage = outage_of(exc)
            if outage is not None and not started:
                await self._outage_response(outage)(scope, receive, send)
                return
            error_id = uuid.uuid4().hex[:12]
            log.exception(
                "unhandled error %s in %s %s", error_id, scope.get("method"), scope.get("path")
            )
            if started:  # half a response is out: only closing the connection is left
                raise
            response = JSONResponse(
                {"detail": f"internal error {error_id} (see the server log)", "error_id": error_id},
                status_code=500,
            )
            await response(scope, receive, send)

    def _outage_response(self, outage: Outage) -> Response:
        advice = "free space there" if outage.kind is OutageKind.DISK_FULL else "wait"
        message = (
            f"{outage.describe(self.store_location)}; nothing was recorded: {advice} and try again"
        )
        # One outage is one line, however its wording varies (a database refusing, then
        # its socket gone): told apart by kind and place.
        key = f"{outage.kind.value}: {outage.path or self.store_location}"
        now = time.monotonic()
        with self._log_lock:
            last = self._logged
            fresh = last is None or last[0] != key or now - last[1] > _OUTAGE_LOG_EVERY_S
            if fresh:
                self._logged = (key, now)
        if fresh:
            log.warning("a request could not be recorded: %s", message)
        if outage.kind is OutageKind.DISK_FULL:
            status, headers = INSUFFICIENT_STORAGE, None
        else:
            status, headers = UNAVAILABLE, {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse(
            {"detail": message, "cause": outage.kind.value}, status_code=status, headers=headers
        )


def install_request_guards(
    app: FastAPI, max_body_bytes: int = MAX_BODY_BYTES, *, store_location: str = "the store"
) -> None:
    """Add the body size limit, the parsing threads and the error responses to ``app``
    (before it serves); ``store_location`` is named when the store cannot be written."""
    app.add_exception_handler(RequestValidationError, _validation_problems)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    # Added last, so outermost: it also catches what the body limit raises.
    app.add_middleware(ErrorResponses, store_location=store_location)
    app.state.parsers = CapacityLimiter(PARSERS)


async def off_loop(request: Request, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in a worker thread: CPU-bound parsing that must not stall the loop.

    At most :data:`PARSERS` run at once per app (see :func:`install_request_guards`).
    """
    limiter: CapacityLimiter | None = getattr(request.app.state, "parsers", None)
    return await anyio.to_thread.run_sync(work, *args, limiter=limiter)
