"""The SDK's verbs on users (admins), tokens (one's own; anyone's for admins) and ``me``.

Mixed into :class:`tidal.client.Client`, whose transport (``_request``) they use.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from tidal.wire.accounts import NewToken, TokenView, UserView

if TYPE_CHECKING:
    import httpx

__all__ = ["AccountVerbs"]


class AccountVerbs:
    """``me``, ``users``, ``add_user``, ``change_user``, ``remove_user``, ``tokens``,
    ``create_token``, ``revoke_token``."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def me(self) -> UserView:
        """The user this client's token stands for."""
        return UserView.model_validate(self._request("GET", "/me").json())

    def users(self) -> builtins.list[UserView]:
        """Every user (admins only)."""
        return [UserView.model_validate(u) for u in self._request("GET", "/users").json()]

    def add_user(self, name: str, role: str = "member", team: str = "default") -> UserView:
        """Add a user (admins only)."""
        body = {"name": name, "role": role, "team": team}
        return UserView.model_validate(self._request("POST", "/users", json=body).json())

    def change_user(self, name: str, role: str | None = None, team: str | None = None) -> UserView:
        """Change a user's role, team, or both (admins only); the user as changed."""
        body = {k: v for k, v in (("role", role), ("team", team)) if v is not None}
        return UserView.model_validate(self._request("PATCH", f"/users/{name}", json=body).json())

    def remove_user(self, name: str) -> UserView:
        """Remove a user and revoke their tokens (admins only)."""
        return UserView.model_validate(self._request("DELETE", f"/users/{name}").json())

    def tokens(self, user: str | None = None) -> builtins.list[TokenView]:
        """Tokens of ``user`` (default: an admin's, everyone's; anyone else's, their own):
        names and dates, never the tokens. Another user's are for admins only."""
        params = {"user": user} if user else {}
        data = self._request("GET", "/tokens", params=params).json()
        return [TokenView.model_validate(t) for t in data]

    def create_token(
        self, name: str, user: str | None = None, expires_in_s: float | None = None
    ) -> NewToken:
        """Create a token (of ``user``, default the caller's own); the answer is the only
        place it is ever shown (another user's: admins only)."""
        body: dict[str, Any] = {"name": name}
        if user is not None:
            body["user"] = user
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return NewToken.model_validate(self._request("POST", "/tokens", json=body).json())

    def revoke_token(self, user: str, name: str) -> TokenView:
        """Revoke ``user``'s token ``name`` and its dashboard sessions (another user's:
        admins only)."""
        return TokenView.model_validate(
            self._request("POST", f"/tokens/{user}/{name}/revoke").json()
        )
