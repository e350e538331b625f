"""Bearer-token auth: one admin token, created at the server's first start.

The token lives in the data dir (mode 0600) so the CLI and SDK on the same machine find it
without the user copying secrets around; other machines pass it explicitly.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

__all__ = ["TOKEN_FILE", "BearerAuth", "ensure_token", "read_token"]

log = logging.getLogger(__name__)

TOKEN_FILE = "token"

_bearer = HTTPBearer(auto_error=False, description="The admin token from the data dir.")


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


def read_token(data_dir: Path) -> str | None:
    """The admin token stored in ``data_dir``, if any."""
    path = data_dir / TOKEN_FILE
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users; chmod 600 it", path)
    return text or None


class BearerAuth:
    """A FastAPI dependency that admits a request only with ``Authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would admit everyone")
        self._token = token.encode()

    def __call__(
        self, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> None:
        """Raise 401 unless the request carries the token."""
        given = credentials.credentials.encode() if credentials is not None else b""
        # Constant-time comparison: response timing must not leak the token.
        if not given or not hmac.compare_digest(given, self._token):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="missing or invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )
