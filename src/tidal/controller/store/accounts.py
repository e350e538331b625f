"""Users, their API tokens and the dashboard's sessions, in the store.

Tokens and session ids are never stored: only their keyed hashes (``digest``, computed by
:class:`~tidal.controller.credentials.ServerKey`), looked up by equality on a unique key
and compared again with :func:`hmac.compare_digest`. Every public method is one
transaction.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tidal.controller.store.database import Database
from tidal.controller.store.tables import SessionRow, TokenRow, UserRow
from tidal.model import DEFAULT_OWNER, DEFAULT_TEAM

__all__ = [
    "USE_RESOLUTION_S",
    "AccountError",
    "Accounts",
    "Identity",
    "TokenRecord",
    "UserRecord",
]

#: A token's last use is kept to this many seconds: a busy client costs the store one
#: write a minute, not one a request.
USE_RESOLUTION_S = 60.0


class AccountError(ValueError):
    """A change to users or tokens that cannot be made (the message says why)."""


@dataclass(frozen=True)
class UserRecord:
    """A user: their role (``admin``, ``member``, ``viewer``) and team."""

    name: str
    role: str
    team: str
    created_at: float


@dataclass(frozen=True)
class TokenRecord:
    """A token as listed: never the token itself, nor its hash."""

    id: int
    name: str
    user: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    #: When a request last came through it (to :data:`USE_RESOLUTION_S`); ``None``: never.
    last_used_at: float | None = None

    def usable(self, now: float) -> bool:
        """Not revoked and not expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True)
class Identity:
    """Whom a token or a session stands for, and until when."""

    user: UserRecord
    token_id: int
    #: When the token (or session) stops being accepted; ``None``: never.
    expires_at: float | None


def _token(row: TokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        name=row.name,
        user=row.user,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


def _user(row: UserRow) -> UserRecord:
    return UserRecord(name=row.name, role=row.role, team=row.team, created_at=row.created_at)


def _earliest(*times: float | None) -> float | None:
    given = [t for t in times if t is not None]
    return min(given) if given else None


class Accounts(Database):
    """The store's users, tokens and sessions (a base of
    :class:`~tidal.controller.store.jobs.JobStore`)."""

    # -- users ----------------------------------------------------------------------------

    def add_user(self, name: str, role: str, team: str, now: float | None = None) -> UserRecord:
        """A new user; :class:`AccountError` if the name is taken."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            if s.get(UserRow, name) is not None:
                raise AccountError(f"user {name!r} exists already")
            row = UserRow(name=name, role=role, team=team, created_at=now)
            s.add(row)
            return _user(row)

    def user(self, name: str) -> UserRecord | None:
        """The user of that name, if any."""
        with self._transaction() as s:
            row = s.get(UserRow, name)
            return None if row is None else _user(row)

    def users(self) -> list[UserRecord]:
        """Every user, by name."""
        with self._transaction() as s:
            return [_user(r) for r in s.scalars(select(UserRow).order_by(UserRow.name))]

    def remove_user(self, name: str) -> UserRecord:
        """Remove a user with their tokens and sessions (their jobs stay, owned by the
        name); :class:`AccountError` if there is no such user or it is the last admin."""
        with self._transaction(write=True) as s:
            row = s.get(UserRow, name)
            if row is None:
                raise AccountError(f"no user {name!r}")
            if row.role == "admin":
                admins = s.scalars(select(UserRow.name).where(UserRow.role == "admin")).all()
                if len(admins) <= 1:
                    raise AccountError(f"{name!r} is the last admin: add another one first")
            record = _user(row)
            s.execute(delete(SessionRow).where(SessionRow.user == name))
            s.execute(delete(TokenRow).where(TokenRow.user == name))
            s.delete(row)
            return record

    def set_user(
        self, name: str, role: str | None = None, team: str | None = None
    ) -> tuple[UserRecord, UserRecord]:
        """Change a user's role and/or team; the user before and after.
        :class:`AccountError` if there is no such user, or the change would leave the
        store without an admin (the message starts with the field, ``role:``)."""
        with self._transaction(write=True) as s:
            row = s.get(UserRow, name)
            if row is None:
                raise AccountError(f"no user {name!r}")
            before = _user(row)
            if role is not None and role != "admin" and row.role == "admin":
                # Locked: two admins demoting each other at once must not both succeed.
                admins = s.scalars(
                    select(UserRow.name).where(UserRow.role == "admin").with_for_update()
                ).all()
                if len(admins) <= 1:
                    raise AccountError(
                        f"role: {name!r} is the last admin: make another user an admin first"
                    )
            if role is not None:
                row.role = role
            if team is not None:
                row.team = team
            s.flush()
            return before, _user(row)

    def ensure_admin(self, now: float | None = None) -> UserRecord | None:
        """The user ``admin`` (made, role admin, team ``default``, when the store has no
        admin at all); ``None`` when it is gone and other admins hold the store."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            row = s.get(UserRow, DEFAULT_OWNER)
            if row is not None:
                return _user(row)
            if s.scalars(select(UserRow.name).where(UserRow.role == "admin")).first():
                return None
            row = UserRow(name=DEFAULT_OWNER, role="admin", team=DEFAULT_TEAM, created_at=now)
            s.add(row)
            return _user(row)

    # -- tokens ---------------------------------------------------------------------------

    def add_token(
        self,
        user: str,
        name: str,
        digest: str,
        expires_at: float | None = None,
        now: float | None = None,
    ) -> TokenRecord:
        """Record a new token of ``user`` by its keyed hash; :class:`AccountError` if
        there is no such user or it holds a live token of that name already."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            if s.get(UserRow, user) is None:
                raise AccountError(f"no user {user!r}")
            taken = s.scalars(
                select(TokenRow).where(TokenRow.user == user, TokenRow.name == name)
            ).all()
            if any(_token(t).usable(now) for t in taken):
                raise AccountError(f"user {user!r} has a token named {name!r} already")
            row = TokenRow(
                name=name, user=user, digest=digest, created_at=now, expires_at=expires_at
            )
            s.add(row)
            s.flush()
            return _token(row)

    def has_token(self, digest: str) -> bool:
        """Whether a token of that keyed hash was ever recorded (even revoked)."""
        with self._transaction() as s:
            return (
                s.scalars(select(TokenRow.id).where(TokenRow.digest == digest)).first() is not None
            )

    def tokens(self, user: str | None = None) -> list[TokenRecord]:
        """Tokens (of ``user`` if given), oldest first."""
        query = select(TokenRow).order_by(TokenRow.id)
        if user is not None:
            query = query.where(TokenRow.user == user)
        with self._transaction() as s:
            return [_token(r) for r in s.scalars(query)]

    def note_token_use(self, token_id: int, now: float | None = None) -> bool:
        """Record that a request came through token ``token_id`` at ``now``, unless a use
        within :data:`USE_RESOLUTION_S` before it is recorded already; whether it wrote."""
        now = time.time() if now is None else now
        stale = (TokenRow.last_used_at.is_(None)) | (
            TokenRow.last_used_at <= now - USE_RESOLUTION_S
        )
        with self._transaction() as s:
            done = s.execute(
                update(TokenRow).where(TokenRow.id == token_id, stale).values(last_used_at=now)
            )
            return bool(getattr(done, "rowcount", 0))

    def revoke_token(self, user: str, name: str, now: float | None = None) -> TokenRecord:
        """Revoke ``user``'s live token ``name`` and the dashboard sessions opened with
        it; :class:`AccountError` if there is none."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            rows = s.scalars(
                select(TokenRow).where(TokenRow.user == user, TokenRow.name == name)
            ).all()
            live = [r for r in rows if _token(r).usable(now)]
            if not live:
                raise AccountError(f"user {user!r} has no live token named {name!r}")
            for row in live:
                row.revoked_at = now
                s.execute(
                    update(SessionRow)
                    .where(SessionRow.token_id == row.id, SessionRow.revoked_at.is_(None))
                    .values(revoked_at=now)
                )
            s.flush()
            return _token(live[0])

    def identify_token(self, digest: str, now: float | None = None) -> Identity | None:
        """Whom the token of this keyed hash stands for; ``None`` if unknown, revoked or
        expired."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            token = s.scalars(select(TokenRow).where(TokenRow.digest == digest)).first()
            if token is None or not hmac.compare_digest(token.digest, digest):
                return None
            if not _token(token).usable(now):
                return None
            return _identity(s, token, token.expires_at)

    # -- dashboard sessions ---------------------------------------------------------------

    def add_session(
        self, digest: str, token_id: int, expires_at: float, now: float | None = None
    ) -> None:
        """Record a dashboard login made with token ``token_id``, by its id's keyed hash."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            token = s.get(TokenRow, token_id)
            if token is None:
                raise AccountError(f"no token {token_id}")
            s.add(
                SessionRow(
                    digest=digest,
                    user=token.user,
                    token_id=token_id,
                    created_at=now,
                    expires_at=expires_at,
                )
            )

    def identify_session(self, digest: str, now: float | None = None) -> Identity | None:
        """Whom the session of this keyed hash stands for; ``None`` if unknown, ended,
        or its token no longer usable."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            session = s.get(SessionRow, digest)
            if session is None or not hmac.compare_digest(session.digest, digest):
                return None
            if session.revoked_at is not None or now >= session.expires_at:
                return None
            token = s.get(TokenRow, session.token_id)
            if token is None or not _token(token).usable(now):
                return None
            return _identity(s, token, _earliest(session.expires_at, token.expires_at))

    def end_session(self, digest: str, now: float | None = None) -> bool:
        """Revoke a session (logout); whether there was a live one."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            done = s.execute(
                update(SessionRow)
                .where(SessionRow.digest == digest, SessionRow.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            return bool(getattr(done, "rowcount", 0))


def _identity(s: Session, token: TokenRow, expires_at: float | None) -> Identity | None:
    user = s.get(UserRow, token.user)
    if user is None:
        return None
    return Identity(user=_user(user), token_id=token.id, expires_at=expires_at)
