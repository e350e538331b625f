"""One-time login links: a URL that logs a browser in once, without the token in it.

A link carries a random nonce, good for one use and :data:`LINK_TTL_S` seconds, and logs
in as the user whose token made it (the server's own link: the admin's). Opening it opens
a session as the login page does and redirects to ``/``: the address bar and
the history keep the redirect's target, not the nonce, and the token itself is never in a
URL. The server prints one at start; ``POST /login/links`` (authenticated: ``tidal
login-link``) makes more.

The nonces live in the server process's memory only: a restart forgets every link not yet
used, and they are not shared between servers.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request, status
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from tidal.controller.access import Principal
from tidal.controller.routes.auth import TokenAuth
from tidal.controller.store.accounts import Identity
from tidal.wire.schema import LoginLinkView

__all__ = ["LINK_PATH", "LINK_TTL_S", "LoginLink", "LoginLinks", "mount_login_links"]

log = logging.getLogger(__name__)

#: How long a link stays good.
LINK_TTL_S = 300.0
#: Where a link points; the nonce is its ``nonce`` query parameter.
LINK_PATH = "/login/link"
#: Unused links kept at most: past it, making one drops the oldest.
MAX_OPEN_LINKS = 1000
#: Where a refused link (used, expired, unknown) lands: the login page, saying why.
REFUSED_PATH = "/login?link=refused"
#: A refused nonce costs the guesser this long (as a wrong token does at the login).
_REFUSAL_DELAY_S = 0.3


@dataclass(frozen=True)
class LoginLink:
    """A link made: its URL and when it stops working (Unix seconds)."""

    url: str
    expires_at: float


class LoginLinks:
    """The nonces of the links made and not yet used, in this process's memory.

    Thread-safe: links are made from the server's start and from requests, and used
    from requests."""

    def __init__(
        self,
        ttl_s: float = LINK_TTL_S,
        max_open: int = MAX_OPEN_LINKS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0 or max_open < 1:
            raise ValueError(f"ttl_s must be > 0 and max_open ≥ 1 (got {ttl_s}, {max_open})")
        self._ttl_s = ttl_s
        self._max_open = max_open
        self._clock = clock
        self._lock = threading.Lock()
        # nonce → (expiry, whom it logs in), oldest first (dicts keep insertion order).
        self._open: dict[str, tuple[float, Identity]] = {}

    def make(self, base_url: str, grant: Identity) -> LoginLink:
        """A new link to the server at ``base_url`` that logs in as ``grant``."""
        nonce = secrets.token_urlsafe(32)
        now = self._clock()
        expires_at = now + self._ttl_s
        with self._lock:
            for old in [n for n, (until, _) in self._open.items() if until <= now]:
                del self._open[old]
            while len(self._open) >= self._max_open:
                del self._open[next(iter(self._open))]
            self._open[nonce] = (expires_at, grant)
        return LoginLink(f"{base_url.rstrip('/')}{LINK_PATH}?nonce={nonce}", expires_at)

    def use(self, nonce: str) -> Identity | None:
        """Whom ``nonce`` logs in, if it is a link's, unused and unexpired; it is spent
        either way."""
        with self._lock:
            entry = self._open.pop(nonce, None)
        if entry is None or self._clock() >= entry[0]:
            return None
        return entry[1]


def mount_login_links(
    app: FastAPI,
    auth: TokenAuth,
    links: LoginLinks,
    log_in: Callable[[Request, Response, Identity], Awaitable[None]],
) -> None:
    """Serve ``GET /login/link`` (open a link: ``log_in`` the browser, then ``/``) and
    ``POST /login/links`` (make one; with the token)."""
    router = APIRouter(include_in_schema=False)

    @router.get(LINK_PATH)
    async def open_link(request: Request, nonce: str = "") -> Response:
        """Log in with a link, once; a used, expired or unknown one lands on the login
        page, which says so."""
        grant = links.use(nonce)
        if grant is None:
            log.warning("login link refused from %s", request.client)
            await asyncio.sleep(_REFUSAL_DELAY_S)
            return RedirectResponse(REFUSED_PATH, status_code=status.HTTP_303_SEE_OTHER)
        # 303 to a URL without the nonce: that is what the history keeps.
        response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
        await log_in(request, response, grant)
        return response

    @router.post("/login/links", status_code=status.HTTP_201_CREATED, dependencies=[Depends(auth)])
    async def make_link(request: Request) -> LoginLinkView:
        """A new one-time login link to this server, as the caller reaches it, that logs
        in as the caller."""
        who: Principal = request.state.principal
        grant = await run_in_threadpool(_identity, auth, who)
        link = links.make(str(request.base_url), grant)
        return LoginLinkView(url=link.url, expires_at=link.expires_at)

    app.include_router(router)
    app.state.login_links = links


def _identity(auth: TokenAuth, who: Principal) -> Identity:
    """``who``'s token as a grant: a session opened with it ends when the token does."""
    user = auth.store.user(who.user)
    token = next((t for t in auth.store.tokens(who.user) if t.id == who.token_id), None)
    if user is None or token is None:
        raise LookupError(f"user {who.user!r} or its token is gone")
    return Identity(user=user, token_id=token.id, expires_at=token.expires_at)
