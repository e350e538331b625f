"""The API's bodies for users and tokens, shared by the server, the SDK and the CLI."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from tidal.wire.schema import RequestBody

__all__ = [
    "NAME_PATTERN",
    "NewToken",
    "TokenRequest",
    "TokenView",
    "UserChange",
    "UserRequest",
    "UserView",
]

#: User, team and token names: a lower-case letter, then letters, digits, ``_ . -``.
NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
#: A token's longest life: ten years.
MAX_TOKEN_LIFE_S = 10 * 365 * 24 * 3600.0

_Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=63)]
RoleName = Literal["admin", "member", "viewer"]


class UserRequest(RequestBody):
    """Add a user: a name, a role and a team (the team's jobs are theirs to change)."""

    name: _Name
    role: RoleName = "member"
    team: _Name = "default"


class UserChange(RequestBody):
    """Change a user's role, team, or both (at least one)."""

    role: RoleName | None = None
    team: _Name | None = None


class UserView(BaseModel):
    """A user."""

    name: str
    role: str
    team: str
    created_at: float


class TokenRequest(RequestBody):
    """Create a named token for ``user`` (default: the caller), valid for ``expires_in_s``
    seconds (default: until revoked)."""

    name: _Name
    user: _Name | None = None
    expires_in_s: float | None = Field(default=None, gt=0, le=MAX_TOKEN_LIFE_S)


class TokenView(BaseModel):
    """A token as listed: its name and dates, never the token."""

    id: int
    name: str
    user: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    #: When a request last came through it, to the minute (``None``: never).
    last_used_at: float | None = None


class NewToken(TokenView):
    """A token just created: the only answer that holds the token itself."""

    token: str
