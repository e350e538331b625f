"""Routes of the dashboard: its pages, the login that opens a session, assets.

``/`` is the single-page app (its views are ``#/jobs``, ``#/jobs/<id>``, ``#/cluster``,
``#/submit``), ``/login`` the page that takes the token (or a one-time login link:
:mod:`tidal.dashboard.login_links`), ``/ui/...`` the static assets.
The API routes stay where they are; the pages call them with the cookie. The cookie holds
a session id, never a token: the store keeps the id's keyed hash, the session ends at
logout, at its expiry, when its token is revoked or its user removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request, status
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from tidal.controller.credentials import new_secret
from tidal.controller.routes.auth import SESSION_COOKIE, TokenAuth
from tidal.controller.store.accounts import Identity
from tidal.dashboard.login_links import LoginLinks, mount_login_links

__all__ = ["STATIC_DIR", "mount_dashboard"]

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: A wrong token costs the guesser this long, so the login cannot be brute-forced quickly.
_REFUSAL_DELAY_S = 0.3
#: A session ends after this long (or sooner, when its token expires).
SESSION_MAX_AGE_S = 7 * 24 * 3600
#: Pages must never be served stale after an upgrade; assets are small enough to revalidate.
_NO_CACHE = {"Cache-Control": "no-cache"}


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html", headers=_NO_CACHE)


def _is_form(request: Request) -> bool:
    ctype = request.headers.get("content-type", "").split(";")[0].strip()
    return ctype == "application/x-www-form-urlencoded"


async def _given_token(request: Request) -> str | None:
    # The login page posts JSON; a plain form post (no JavaScript) works too.
    body = await request.body()
    if _is_form(request):
        values = parse_qs(body.decode("utf-8", errors="replace")).get("token", [])
        return values[0].strip() if values else None
    try:
        data = json.loads(body or b"null")
    except ValueError:
        return None
    token = data.get("token") if isinstance(data, dict) else None
    return token.strip() if isinstance(token, str) else None


async def _open_session(
    auth: TokenAuth, request: Request, response: Response, found: Identity
) -> None:
    """Open a session for ``found``'s token: the store keeps its id's keyed hash, the
    browser the id in an HttpOnly cookie (scripts on the page cannot read it)."""
    session = new_secret()
    now = time.time()
    ends = now + SESSION_MAX_AGE_S
    if found.expires_at is not None:
        ends = min(ends, found.expires_at)
    await run_in_threadpool(
        auth.store.add_session, auth.key.digest(session), found.token_id, ends, now
    )
    log.info("dashboard login of user %r", found.user.name)
    response.set_cookie(
        SESSION_COOKIE,
        session,
        max_age=max(1, int(ends - now)),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def mount_dashboard(app: FastAPI, auth: TokenAuth) -> None:
    """Serve the dashboard from ``app``: pages at ``/`` and ``/login``, assets at ``/ui``,
    one-time login links at ``/login/link`` (their store is ``app.state.login_links``)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def index(request: Request) -> Response:
        """The app, or the login page for a browser that has not logged in."""
        if auth.identify_session(request.cookies.get(SESSION_COOKIE)) is None:
            return RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
        return _page("index.html")

    @router.get("/login")
    def login_page() -> Response:
        """The page that asks for a user's token (the admin's: printed at the server's
        first start)."""
        return _page("login.html")

    @router.post("/login")
    async def login(request: Request) -> Response:
        """Check the token and open a session, its id in an HttpOnly cookie; 401 when the
        token is unknown, revoked or expired.

        A plain form post (a browser without JavaScript) is sent on to the app."""
        given = await _given_token(request)
        found = await run_in_threadpool(auth.identify, given)
        if found is None:
            log.warning("dashboard login refused from %s", request.client)
            await asyncio.sleep(_REFUSAL_DELAY_S)
            return JSONResponse(
                status_code=status.HTTP_401_UNAUTHORIZED,
                content={"detail": "wrong token"},
            )
        response: Response = (
            RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
            if _is_form(request)
            else Response(status_code=status.HTTP_204_NO_CONTENT)
        )
        await _open_session(auth, request, response, found)
        return response

    @router.post("/logout")
    def logout(request: Request) -> Response:
        """End the session (in the store: its id no longer admits anyone) and forget it
        in this browser."""
        session = request.cookies.get(SESSION_COOKIE)
        if session:
            auth.store.end_session(auth.key.digest(session))
            auth.forget()
        response = Response(status_code=status.HTTP_204_NO_CONTENT)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    app.include_router(router)
    mount_login_links(app, auth, LoginLinks(), partial(_open_session, auth))
    # Assets are public: they hold no data, and the login page needs its own CSS and JS.
    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="dashboard")
