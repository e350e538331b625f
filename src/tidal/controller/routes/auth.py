"""Who a request acts for, and whether they may: users' tokens and dashboard sessions.

Each request carries a user's token (``Authorization: Bearer``, from the CLI, the SDK or a
script) or the dashboard's session cookie. The token is hashed with the server's key
(:mod:`tidal.controller.credentials`) and the hash looked up in the store; an unknown,
revoked or expired one is answered 401. The user's role then decides
(:mod:`tidal.controller.access`, pure) by the route: a change to a job is checked against
the job's team, logs and metrics too, a user's own tokens are theirs to manage, other
users' and user management are for admins, and a changing route this module does not
know is for admins only, so a new route is guarded until it says otherwise. A refusal is
403 naming the reason, before the route runs.

The admin token the server writes into its data dir at its first start (mode 0600) is
the user ``admin``'s token, so the CLI and SDK on the same machine find it as before.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidal.controller.access import (
    SOURCES,
    Principal,
    Role,
    admin_refusal,
    change_refusal,
    read_refusal,
    submit_refusal,
    token_refusal,
)
from tidal.controller.credentials import ServerKey, new_secret
from tidal.controller.store.accounts import USE_RESOLUTION_S, Identity
from tidal.controller.store.jobs import JobStore
from tidal.wire.discovery import SOURCE_HEADER, TOKEN_FILE, read_token

__all__ = [
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "TOKEN_FILE",
    "PrincipalDep",
    "TokenAuth",
    "TokenUse",
    "ensure_token",
    "read_token",
    "register_data_dir_token",
]

log = logging.getLogger(__name__)

#: The dashboard's cookie: a session id (HttpOnly), never a token.
SESSION_COOKIE = "tidal_session"
#: A request authenticated by the cookie that changes anything must carry this header. A
#: page on another site cannot add it without a CORS preflight the API never grants, so a
#: forged form post is refused even by a browser that would send the cookie along.
CSRF_HEADER = "X-Tidal-Request"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Routes (their path templates) whose reads are for the job's team and admins only.
TEAM_READS = frozenset({"/jobs/{ref}/logs", "/jobs/{ref}/metrics"})
#: Changing routes a member may call without naming a job: submitting and checking specs,
#: registering datasets and models, and training a model (a job of theirs).
SUBMIT_ROUTES = frozenset(
    {"/jobs", "/jobs/validate", "/datasets", "/models", "/models/{name}/train"}
)
#: Path prefixes of the routes that manage users, and other tokens than :data:`TOKEN_ROUTES`:
#: admins only.
ADMIN_PREFIXES = ("/users", "/tokens")
#: Routes on a user's tokens (the ``user`` of the path, the query or the body; the caller
#: when none is named): their own for every user, anyone's for admins.
TOKEN_ROUTES = frozenset({"/tokens", "/tokens/{user}/{name}/revoke"})
#: Identities kept in memory at most (a full cache is emptied and refilled).
_CACHE_SIZE = 10_000


def ensure_token(data_dir: Path) -> str:
    """The admin token, created (mode 0600) if the data dir has none yet."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    try:
        # O_EXCL: two servers starting at once must not overwrite each other's token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = read_token(data_dir)
        if existing:
            return existing
        raise RuntimeError(f"{path} exists but holds no token") from None
    token = new_secret()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("wrote a new admin token to %s", path)
    return token


def register_data_dir_token(store: JobStore, key: ServerKey, token: str) -> None:
    """Make the data dir's admin token the user ``admin``'s (at each start: a store made
    by an earlier release, or a new one, gets it; a token once revoked stays revoked)."""
    digest = key.digest(token)
    if store.has_token(digest):
        return
    admin = store.ensure_admin()
    if admin is None:
        log.warning("the store has no user 'admin': the data dir's token is not registered")
        return
    taken = {t.name for t in store.tokens(admin.name)}
    # A data dir whose key was replaced leaves its former token's name behind.
    name = next(n for n in _data_dir_token_names() if n not in taken)
    store.add_token(admin.name, name, digest)
    log.info("registered the data dir's token for user %r", admin.name)


def _data_dir_token_names() -> Iterator[str]:
    yield "data-dir"
    n = 2
    while True:
        yield f"data-dir-{n}"
        n += 1


class TokenAuth(HTTPBearer):
    """A FastAPI dependency: the request's :class:`Principal`, or 401/403.

    The token comes as ``Authorization: Bearer <token>`` (CLI, SDK, scripts) or the
    dashboard's session as a cookie; the header wins when both are present. Identities
    are kept in memory by their keyed hash until :meth:`forget` (every revocation and
    user change goes through this server, the only one on its store), so a request
    costs a hash and a lookup, not a database read.
    """

    def __init__(self, store: JobStore, key: ServerKey) -> None:
        super().__init__(
            auto_error=False,
            scheme_name="HTTPBearer",
            description="A user's API token (`tidal token create`; the admin's is in the "
            "data dir).",
        )
        self.store = store
        self.key = key
        self._tokens: dict[str, Identity] = {}
        self._sessions: dict[str, Identity] = {}
        #: When each token's use was last recorded: the store is written once a minute.
        self._noted: dict[int, float] = {}

    def forget(self) -> None:
        """Drop every identity kept: after a token or session is revoked, a user removed."""
        self._tokens = {}
        self._sessions = {}

    @staticmethod
    def _live(found: Identity | None, now: float) -> Identity | None:
        if found is None or (found.expires_at is not None and now >= found.expires_at):
            return None
        return found

    def identify(self, token: str | None) -> Identity | None:
        """Whom ``token`` stands for (``None``: nobody); reads the store on a miss."""
        if not token:
            return None
        digest = self.key.digest(token)
        now = time.time()
        found = self._live(self._tokens.get(digest), now)
        if found is None:
            found = self.store.identify_token(digest, now)
            if found is not None:
                self._keep(self._tokens, digest, found)
        return found

    def identify_session(self, session_id: str | None) -> Identity | None:
        """Whom the dashboard session ``session_id`` stands for (``None``: nobody)."""
        if not session_id:
            return None
        digest = self.key.digest(session_id)
        now = time.time()
        found = self._live(self._sessions.get(digest), now)
        if found is None:
            found = self.store.identify_session(digest, now)
            if found is not None:
                self._keep(self._sessions, digest, found)
        return found

    @staticmethod
    def _keep(cache: dict[str, Identity], digest: str, found: Identity) -> None:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        cache[digest] = found

    def _cached(self, digest_of: str, cache: dict[str, Identity]) -> Identity | None:
        return self._live(cache.get(self.key.digest(digest_of)), time.time())

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        """The request's principal, kept in ``request.state.principal``; 401 without a
        usable token or session, 403 when its user may not use this route."""
        scheme, credentials = get_authorization_scheme_param(request.headers.get("Authorization"))
        if credentials and scheme.lower() == "bearer":
            found = self._cached(credentials, self._tokens)
            if found is None:
                found = await run_in_threadpool(self.identify, credentials)
            claimed = request.headers.get(SOURCE_HEADER, "api")
            source = claimed if claimed in SOURCES and claimed != "dashboard" else "api"
        else:
            cookie = request.cookies.get(SESSION_COOKIE)
            found = None
            if cookie:
                found = self._cached(cookie, self._sessions)
                if found is None:
                    found = await run_in_threadpool(self.identify_session, cookie)
            if found is not None and not (
                request.method in _SAFE_METHODS or request.headers.get(CSRF_HEADER)
            ):
                raise _forbidden(f"a request authenticated by cookie must carry {CSRF_HEADER}")
            source = "dashboard"
        if found is None:
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="missing, unknown, revoked or expired token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        who = Principal(
            user=found.user.name,
            role=Role(found.user.role),
            team=found.user.team,
            token_id=found.token_id,
            source=source,
        )
        request.state.principal = who
        refusal = await self._refusal(who, request)
        if refusal is not None:
            raise _forbidden(refusal)
        return who

    async def note_use(self, token_id: int) -> None:
        """Record the token's use, once a minute at most; a store that cannot take it
        costs a warning, never the request."""
        now = time.time()
        if now - self._noted.get(token_id, float("-inf")) < USE_RESOLUTION_S:
            return
        self._noted[token_id] = now
        try:
            await run_in_threadpool(self.store.note_token_use, token_id, now)
        except Exception as exc:
            log.warning("the use of token %d was not recorded: %s", token_id, exc)

    async def _refusal(self, who: Principal, request: Request) -> str | None:
        route = request.scope.get("route")
        path: str = getattr(route, "path", request.url.path)
        if path in TOKEN_ROUTES:
            return token_refusal(who, await _token_owner(request, who))
        if path.startswith(ADMIN_PREFIXES):
            return admin_refusal(who)
        safe = request.method in _SAFE_METHODS
        if safe and path not in TEAM_READS:
            return None
        if not safe and path in SUBMIT_ROUTES:
            return submit_refusal(who)
        ref = request.path_params.get("ref")
        if ref is None:
            return admin_refusal(who)
        if who.role is Role.ADMIN:
            return None
        job = await run_in_threadpool(self.store.resolve, str(ref))
        if job is None:
            return None if who.role is not Role.VIEWER or safe else change_refusal(who, "")
        return read_refusal(who, job.team) if safe else change_refusal(who, job.team)


class TokenUse:
    """ASGI middleware: a request answered below 400 records that its token was used
    (:meth:`TokenAuth.note_use`), after its answer is sent. A refused or failed request
    records nothing: it changes nothing in the store."""

    def __init__(self, app: ASGIApp, auth: TokenAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, watching its answer's status."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = 500

        async def watched(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = int(message["status"])
            await send(message)

        await self.app(scope, receive, watched)
        # Starlette keeps ``request.state`` in the scope: the principal TokenAuth found.
        who = scope.get("state", {}).get("principal")
        if isinstance(who, Principal) and answered < 400:
            await self.auth.note_use(who.token_id)


async def _token_owner(request: Request, who: Principal) -> str:
    """The user whose tokens a request on :data:`TOKEN_ROUTES` acts on: the path's, the
    query's or the body's ``user``, else the caller (a body that is not the expected
    object is left to the route's validation, which answers 422)."""
    named = request.path_params.get("user") or request.query_params.get("user")
    if named is None and request.method == "POST":
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("user"), str):
            named = body["user"]
    return str(named) if named else who.user


def _forbidden(reason: str) -> HTTPException:
    return HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=reason)


async def _principal(request: Request) -> Principal:
    who: Principal = request.state.principal
    return who


#: The request's principal, for a route that records who acted or checks a value.
PrincipalDep = Annotated[Principal, Depends(_principal)]
