"""Who may do what: users' roles and the decisions on each request (pure).

A **viewer** reads; a **member** also submits jobs (owned by them, in their team) and
changes the jobs of their team (cancel, priority within :data:`MEMBER_PRIORITIES`, scale,
stop a worker); an **admin** does everything, including managing users and everyone's
tokens. Every user, viewers too, manages their own tokens.
Logs and metrics of a job are read by its team and by admins only. Each decision answers
``None`` (allowed) or the reason of the refusal, for a 403 that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "MEMBER_PRIORITIES",
    "SOURCES",
    "Principal",
    "Role",
    "admin_refusal",
    "change_refusal",
    "priority_refusal",
    "read_refusal",
    "submit_refusal",
    "submit_team",
    "team_refusal",
    "token_refusal",
]

#: The priorities a member may give their team's jobs (the default, 5000, is inside);
#: admins may give any.
MEMBER_PRIORITIES = (1, 10_000)
#: Where a change may come from, as recorded in the audit trail.
SOURCES = ("cli", "api", "dashboard")


class Role(str, Enum):
    """What a user may do."""

    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


@dataclass(frozen=True)
class Principal:
    """The user a request acts for, and through what (``cli``, ``api``, ``dashboard``)."""

    user: str
    role: Role
    team: str
    token_id: int
    source: str = "api"


def change_refusal(who: Principal, job_team: str) -> str | None:
    """Why ``who`` may not change a job of ``job_team`` (``None``: they may)."""
    if who.role is Role.ADMIN:
        return None
    if who.role is Role.VIEWER:
        return f"user {who.user!r} is a viewer: viewers change nothing"
    if who.team != job_team:
        return (
            f"the job belongs to team {job_team!r}; user {who.user!r} may change only "
            f"jobs of team {who.team!r}"
        )
    return None


def read_refusal(who: Principal, job_team: str) -> str | None:
    """Why ``who`` may not read a job's logs and metrics (``None``: they may)."""
    if who.role is Role.ADMIN or who.team == job_team:
        return None
    return f"logs and metrics of team {job_team!r}'s jobs are for that team and admins"


def submit_refusal(who: Principal) -> str | None:
    """Why ``who`` may not submit jobs (``None``: they may)."""
    if who.role is Role.VIEWER:
        return f"user {who.user!r} is a viewer: viewers submit nothing"
    return None


def submit_team(who: Principal, asked: str | None) -> tuple[str, str | None]:
    """The team a job ``who`` submits goes to, given the spec's ``team`` (``asked``), and
    why not, if they may not put it there: admins submit to any team, others to their own."""
    if asked is None or asked == who.team or who.role is Role.ADMIN:
        return asked or who.team, None
    return who.team, (
        f"team: user {who.user!r} may submit only to team {who.team!r} (got {asked!r})"
    )


def admin_refusal(who: Principal) -> str | None:
    """Why ``who`` may not make a change reserved to admins (``None``: they may)."""
    if who.role is Role.ADMIN:
        return None
    return f"user {who.user!r} is a {who.role.value}: only admins may do this"


def priority_refusal(who: Principal, priority: int) -> str | None:
    """Why ``who`` may not give a job ``priority`` (``None``: they may)."""
    low, high = MEMBER_PRIORITIES
    if who.role is Role.ADMIN or low <= priority <= high:
        return None
    return f"priority: members may set {low}..{high} (got {priority}); ask an admin"


def token_refusal(who: Principal, owner: str) -> str | None:
    """Why ``who`` may not create, list or revoke the tokens of user ``owner`` (``None``:
    they may): every user manages their own, admins anyone's."""
    if who.role is Role.ADMIN or who.user == owner:
        return None
    return (
        f"user {who.user!r} may manage only their own tokens; "
        f"those of {owner!r} are for them and admins"
    )


def team_refusal(team: str, known: frozenset[str] | None) -> str | None:
    """Why a user may not be put in ``team`` (``None``: they may). ``known``: the teams of
    the server's teams file and ``default``; ``None`` when it runs without one, and any
    team name will do (a job of an unlisted team queues in a team of its own)."""
    if known is None or team in known:
        return None
    return f"{team!r} is not a team of this server (its teams: {', '.join(sorted(known))})"
