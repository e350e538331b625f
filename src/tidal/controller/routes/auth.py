"""Bearer-token auth: one admin token, created at the server's first start.

The token lives in the data dir (mode 0600) so the CLI and SDK on the same machine find it
without the user copying secrets around; other machines pass it explicitly. The dashboard's
browser sends the same token as an HttpOnly cookie set by its login page.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from tidal.wire.discovery import TOKEN_FILE, read_token

__all__ = [
    "CSRF_HEADER",
    "TOKEN_COOKIE",
    "TOKEN_FILE",
    "BearerAuth",
    "ensure_token",
    "read_token",
]

log = logging.getLogger(__name__)

#: The cookie the dashboard's login sets; it holds the token itself (HttpOnly).
TOKEN_COOKIE = "tidal_token"
#: A request authenticated by the cookie that changes anything must carry this header. A
#: page on another site cannot add it without a CORS preflight the API never grants, so a
#: forged form post is refused even by a browser that would send the cookie along.
CSRF_HEADER = "X-Tidal-Request"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def ensure_token(data_dir: Path) -> str:
    """The admin token, created (mode 0600) if the data dir has none yet."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    token = secrets.token_urlsafe(32)
    try:
        # O_EXCL: two servers starting at once must not overwrite each other's token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = read_token(data_dir)
        if existing:
            return existing
        raise RuntimeError(f"{path} exists but holds no token") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("wrote a new admin token to %s", path)
    return token


class BearerAuth(HTTPBearer):
    """A FastAPI dependency that admits a request only with the admin token.

    The token comes as ``Authorization: Bearer <token>`` (CLI, SDK, scripts) or as the
    dashboard's cookie; the header wins when both are present. The OpenAPI schema shows
    it as the ``HTTPBearer`` security scheme. It reads the header itself rather than
    through FastAPI's ``HTTPBearer`` dependency: one dependency per request, not two,
    and no credentials model built and validated each time.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would admit everyone")
        super().__init__(
            auto_error=False,
            scheme_name="HTTPBearer",
            description="The admin token from the data dir.",
        )
        self._token = token.encode()

    def check(self, given: str | None) -> bool:
        """Whether ``given`` is the token (in constant time: timing must not leak it)."""
        return bool(given) and hmac.compare_digest((given or "").encode(), self._token)

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        """Raise 401 unless the request carries the token (403 for a cookie without the
        anti-forgery header on a request that changes something).

        A coroutine although it does no I/O: FastAPI runs a plain function dependency in
        its thread pool, a hand-over per request that cost more than the check."""
        scheme, credentials = get_authorization_scheme_param(request.headers.get("Authorization"))
        if credentials and scheme.lower() == "bearer":
            if self.check(credentials):
                return
        else:
            cookie = request.cookies.get(TOKEN_COOKIE)
            if self.check(cookie):
                if request.method in _SAFE_METHODS or request.headers.get(CSRF_HEADER):
                    return
                raise HTTPException(
                    status_code=status.HTTP_403_FORBIDDEN,
                    detail=f"a request authenticated by cookie must carry {CSRF_HEADER}",
                )
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
