"""What the SDK raises when the server refuses a request or cannot be reached.

Its own module, so the worker verbs (:mod:`tidal.client.worker_verbs`) and the client
(:mod:`tidal.client.sdk`) both raise them without importing each other.
"""

from __future__ import annotations

import builtins
from typing import Any

__all__ = [
    "AuthError",
    "ClientError",
    "Conflict",
    "InvalidRequest",
    "NotFound",
    "ServerUnavailable",
    "problems",
]


class ClientError(Exception):
    """The server refused a request, or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerUnavailable(ClientError):
    """No server found, or it did not answer in time."""


class AuthError(ClientError):
    """Missing or wrong token (401)."""


class NotFound(ClientError):
    """No such job (404)."""


class Conflict(ClientError):
    """The request does not fit the job's state, e.g. scaling a finished job (409)."""


class InvalidRequest(ClientError):
    """The request was refused as invalid (422); ``problems`` lists ``(field path, message)``."""

    def __init__(self, problems: builtins.list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems), 422)


def problems(detail: Any) -> builtins.list[tuple[str, str]]:
    """``(field path, message)`` pairs from a refusal's ``detail`` (FastAPI's list of
    errors, or any other value as one message without a path)."""
    if not isinstance(detail, builtins.list):
        return [("", str(detail))]
    out = []
    for item in detail:
        if not isinstance(item, dict):
            out.append(("", str(item)))
            continue
        path = item.get("path")
        if path is None:
            loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
            path = ".".join(loc)
        out.append((str(path), str(item.get("msg", "invalid"))))
    return out
