"""Users and their tokens: ``/me`` and one's own tokens for everyone, users and others'
tokens for admins (the route guard in :mod:`~tidal.controller.routes.auth` refuses others
before these run). A token is shown once, in the answer that creates it; the store keeps
its keyed hash only."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request, status

from tidal.controller.access import Principal, Role, team_refusal
from tidal.controller.credentials import new_secret
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import PrincipalDep, TokenAuth
from tidal.controller.routes.deps import ControllerDep, JobStoreDep, invalid
from tidal.controller.routes.errors import ACCOUNT_ERRORS, ProtectedRoute
from tidal.controller.store.accounts import AccountError, TokenRecord, UserRecord
from tidal.controller.store.jobs import JobStore
from tidal.model import DEFAULT_TEAM
from tidal.policy.team_queues import TeamQueues
from tidal.wire.accounts import (
    NewToken,
    TokenRequest,
    TokenView,
    UserChange,
    UserRequest,
    UserView,
)

__all__ = ["router"]

router = APIRouter(tags=["users"], route_class=ProtectedRoute)


def _user_view(u: UserRecord) -> UserView:
    return UserView.model_validate(u, from_attributes=True)


def _token_view(t: TokenRecord) -> TokenView:
    return TokenView.model_validate(t, from_attributes=True)


def _audit(store: JobStore, who: Principal, kind: str, message: str) -> None:
    """Record an account change with who made it and from where."""
    store.add_event(None, kind, message, actor=who.user, source=who.source)


def _auth(request: Request) -> TokenAuth:
    auth: TokenAuth = request.app.state.auth
    return auth


def _check_team(team: str | None, controller: Controller) -> None:
    """422 naming ``team`` when the server's teams file does not list it."""
    policy = controller.policy
    known = (
        frozenset({DEFAULT_TEAM, *(t.name for t in policy.teams)})
        if isinstance(policy, TeamQueues)
        else None
    )
    refusal = None if team is None else team_refusal(team, known)
    if refusal is not None:
        raise invalid("team", refusal)


def _refused(exc: AccountError) -> HTTPException:
    missing = str(exc).startswith("no ")
    code = status.HTTP_404_NOT_FOUND if missing else status.HTTP_409_CONFLICT
    return HTTPException(status_code=code, detail=str(exc))


@router.get("/me", response_model=UserView, responses=ACCOUNT_ERRORS)
def me(who: PrincipalDep, store: JobStoreDep) -> UserView:
    """The user the request's token or session stands for."""
    user = store.user(who.user)
    if user is None:
        raise HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail="no such user")
    return _user_view(user)


@router.get("/users", response_model=list[UserView])
def list_users(store: JobStoreDep) -> list[UserView]:
    """Every user, by name."""
    return [_user_view(u) for u in store.users()]


@router.post(
    "/users", response_model=UserView, status_code=status.HTTP_201_CREATED, responses=ACCOUNT_ERRORS
)
def add_user(
    body: UserRequest, controller: ControllerDep, store: JobStoreDep, who: PrincipalDep
) -> UserView:
    """Add a user (409 if the name is taken; 422 for a team the teams file lacks)."""
    _check_team(body.team, controller)
    try:
        user = store.add_user(body.name, body.role, body.team)
    except AccountError as exc:
        raise _refused(exc) from None
    _audit(store, who, "user_added", f"{user.name} ({user.role}, team {user.team})")
    return _user_view(user)


@router.patch("/users/{name}", response_model=UserView, responses=ACCOUNT_ERRORS)
def change_user(
    name: str,
    body: UserChange,
    request: Request,
    controller: ControllerDep,
    store: JobStoreDep,
    who: PrincipalDep,
) -> UserView:
    """Change a user's role or team (409 for the last admin's role; 422 for a team the
    teams file lacks); their next request is judged by the new ones."""
    if body.role is None and body.team is None:
        raise invalid("role", "give a new role, a new team, or both")
    _check_team(body.team, controller)
    try:
        before, after = store.set_user(name, body.role, body.team)
    except AccountError as exc:
        raise _refused(exc) from None
    # The identities kept in memory hold the former role and team.
    _auth(request).forget()
    changes = [
        f"{field} {old} → {new}"
        for field, old, new in (
            ("role", before.role, after.role),
            ("team", before.team, after.team),
        )
        if old != new
    ]
    _audit(store, who, "user_changed", f"{name}: {', '.join(changes) or 'unchanged'}")
    return _user_view(after)


@router.delete("/users/{name}", response_model=UserView, responses=ACCOUNT_ERRORS)
def remove_user(name: str, request: Request, store: JobStoreDep, who: PrincipalDep) -> UserView:
    """Remove a user and revoke their tokens and sessions (their jobs stay)."""
    try:
        user = store.remove_user(name)
    except AccountError as exc:
        raise _refused(exc) from None
    _auth(request).forget()
    _audit(store, who, "user_removed", user.name)
    return _user_view(user)


@router.get("/tokens", response_model=list[TokenView])
def list_tokens(store: JobStoreDep, who: PrincipalDep, user: str | None = None) -> list[TokenView]:
    """Tokens of ``user`` (default: an admin's, every user's; anyone else's, their own):
    names and dates, never the tokens."""
    whose = user or (None if who.role is Role.ADMIN else who.user)
    return [_token_view(t) for t in store.tokens(whose)]


@router.post(
    "/tokens",
    response_model=NewToken,
    status_code=status.HTTP_201_CREATED,
    responses=ACCOUNT_ERRORS,
)
def create_token(
    body: TokenRequest, request: Request, store: JobStoreDep, who: PrincipalDep
) -> NewToken:
    """Create a token; the answer holds it, and no later one will."""
    owner = body.user or who.user
    token = new_secret()
    now = time.time()
    expires = None if body.expires_in_s is None else now + body.expires_in_s
    try:
        record = store.add_token(owner, body.name, _auth(request).key.digest(token), expires, now)
    except AccountError as exc:
        raise _refused(exc) from None
    _audit(store, who, "token_created", f"{owner}/{body.name}")
    return NewToken(**_token_view(record).model_dump(), token=token)


@router.post("/tokens/{user}/{name}/revoke", response_model=TokenView, responses=ACCOUNT_ERRORS)
def revoke_token(
    user: str, name: str, request: Request, store: JobStoreDep, who: PrincipalDep
) -> TokenView:
    """Revoke a token and end the dashboard sessions opened with it."""
    try:
        record = store.revoke_token(user, name)
    except AccountError as exc:
        raise _refused(exc) from None
    _auth(request).forget()
    _audit(store, who, "token_revoked", f"{user}/{name}")
    return _token_view(record)
