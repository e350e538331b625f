"""Routes of the dashboard: its pages, the login that turns the token into a cookie, assets.

``/`` is the single-page app (its views are ``#/jobs``, ``#/jobs/<id>``, ``#/cluster``,
``#/submit``), ``/login`` the page that takes the token (or a one-time login link:
:mod:`tidal.dashboard.login_links`), ``/ui/...`` the static assets.
The API routes stay where they are; the pages call them with the cookie.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request, status
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from tidal.controller.routes.auth import TOKEN_COOKIE, BearerAuth
from tidal.dashboard.login_links import LoginLinks, mount_login_links

__all__ = ["STATIC_DIR", "mount_dashboard"]

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: A wrong token costs the guesser this long, so the login cannot be brute-forced quickly.
_REFUSAL_DELAY_S = 0.3
#: The browser forgets the login after this long (the token itself does not expire).
_COOKIE_MAX_AGE_S = 7 * 24 * 3600
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


def _keep_login(request: Request, response: Response, token: str) -> None:
    # The browser keeps the token in an HttpOnly cookie: scripts on the page cannot read it.
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=_COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def mount_dashboard(app: FastAPI, auth: BearerAuth, token: str) -> None:
    """Serve the dashboard from ``app``: pages at ``/`` and ``/login``, assets at ``/ui``,
    one-time login links at ``/login/link`` (their store is ``app.state.login_links``)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def index(request: Request) -> Response:
        """The app, or the login page for a browser that has not logged in."""
        if not auth.check(request.cookies.get(TOKEN_COOKIE)):
            return RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
        return _page("index.html")

    @router.get("/login")
    def login_page() -> Response:
        """The page that asks for the token the server printed at its first start."""
        return _page("login.html")

    @router.post("/login")
    async def login(request: Request) -> Response:
        """Check the token and keep it in an HttpOnly cookie; 401 when it is wrong.

        A plain form post (a browser without JavaScript) is sent on to the app."""
        given = await _given_token(request)
        if not auth.check(given):
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
        _keep_login(request, response, given or "")
        return response

    @router.post("/logout")
    def logout() -> Response:
        """Forget the login in this browser."""
        response = Response(status_code=status.HTTP_204_NO_CONTENT)
        response.delete_cookie(TOKEN_COOKIE, path="/")
        return response

    app.include_router(router)
    mount_login_links(
        app, auth, LoginLinks(), lambda request, response: _keep_login(request, response, token)
    )
    # Assets are public: they hold no data, and the login page needs its own CSS and JS.
    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="dashboard")
