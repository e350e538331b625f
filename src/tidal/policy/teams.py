"""Team queues: what a team is owed of a pool, and what it lends and borrows.

A team has a weight, a guaranteed quota of slots (per resource group where groups exist),
a borrowing limit (most slots above its guarantee) and a hard limit (most slots in all).
:func:`team_shares` splits one pool's slots among teams by count: every team first gets
its guarantee as far as its jobs can use it, then the slots left (idle guarantees of other
teams and slots nobody is guaranteed) go to teams that can use more, in proportion to
weight, each within its limits. Loans already held are kept, and taken back newest first
when a team needs its guarantee (:mod:`tidal.policy.loan_order`).

:func:`loans` says who lends to whom once the counts are known. Pure functions over plain
dataclasses; :mod:`tidal.policy.team_queues` turns the counts into slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "Team",
    "TeamQuotaError",
    "TeamUsage",
    "check_quotas",
    "loans",
    "team_shares",
]


class TeamQuotaError(ValueError):
    """Guaranteed quotas that the pool cannot honour all at once."""


@dataclass(frozen=True)
class Team:
    """One team's queue: plain data the hierarchical policy reads.

    ``guaranteed`` maps a resource group to slots guaranteed in it; the key ``None`` is
    the pool of jobs without a group (any host). ``borrowing_limit``: most slots above the
    guarantee; ``hard_limit``: most slots in all; ``None``: no limit.
    """

    name: str
    weight: float = 1.0
    guaranteed: Mapping[str | None, int] = field(default_factory=dict)
    borrowing_limit: int | None = None
    hard_limit: int | None = None
    #: How the team's loans are taken back: ``shrink`` its jobs in place, or ``evict``
    #: every job that would shrink (it requeues and starts again, as Kueue and KAI do).
    reclaim: str = "shrink"

    def guarantee(self, pool: str | None) -> int:
        """Slots guaranteed to this team in ``pool``."""
        return max(0, self.guaranteed.get(pool, 0))

    @property
    def total_guaranteed(self) -> int:
        """Slots guaranteed over every pool."""
        return sum(max(0, n) for n in self.guaranteed.values())

    def cap(self) -> int | None:
        """Most slots the team may hold in all, from both limits; ``None``: no limit."""
        caps = [c for c in (self.hard_limit,) if c is not None]
        if self.borrowing_limit is not None:
            caps.append(self.total_guaranteed + self.borrowing_limit)
        return min(caps) if caps else None


@dataclass(frozen=True)
class TeamUsage:
    """One team's standing after a decision, in slots over every pool."""

    team: str
    guaranteed: int
    limit: int | None
    used: int
    borrowed: int
    lent: int


def check_quotas(teams: Sequence[Team], capacity: Mapping[str | None, int]) -> None:
    """Refuse guarantees that add up to more than a pool holds, naming the teams.

    ``capacity`` maps each resource group to its slots and ``None`` to the whole cluster;
    the guarantees of every group count against the whole cluster too.
    """
    names = [t.name for t in teams]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TeamQuotaError(f"team {twice[0]!r} is defined twice")
    pools = sorted({p for t in teams for p in t.guaranteed if p is not None})
    for pool in [*pools, None]:
        holders = [t for t in teams if (t.guarantee(pool) if pool else t.total_guaranteed)]
        total = sum(t.guarantee(pool) if pool else t.total_guaranteed for t in holders)
        room = capacity.get(pool, 0)
        if total > room:
            where = f"resource group {pool!r}" if pool else "the pool"
            each = ", ".join(
                f"{t.name} ({t.guarantee(pool) if pool else t.total_guaranteed})" for t in holders
            )
            raise TeamQuotaError(
                f"guaranteed quotas add up to {total} slots but {where} has {room}: {each}"
            )


def fit_quotas(teams: Sequence[Team], capacity: Mapping[str | None, int]) -> tuple[Team, ...]:
    """``teams`` with their guarantees cut, in proportion, to what each pool holds now.

    Guarantees that fitted the pool at start stop fitting when hosts leave it (drained,
    lost): the rest of the pool is then shared in the same proportions, rather than
    scheduling stopping. Each cut guarantee is rounded down and the slots left go to the
    largest remainders (ties to the lower name), so the answer is deterministic.
    """
    cut: dict[str, dict[str | None, int]] = {t.name: dict(t.guaranteed) for t in teams}
    pools = sorted({p for t in teams for p in t.guaranteed if p is not None})
    for pool in pools:
        _scale(cut, pool, capacity.get(pool, 0))
    grouped = sum(n for g in cut.values() for p, n in g.items() if p is not None)
    _scale(cut, None, max(0, capacity.get(None, 0) - grouped))
    return tuple(replace(t, guaranteed=cut[t.name]) for t in teams)


def _scale(cut: dict[str, dict[str | None, int]], pool: str | None, room: int) -> None:
    """Cut every team's guarantee in ``pool`` so that together they fit ``room``."""
    wanted = {name: max(0, g.get(pool, 0)) for name, g in cut.items()}
    total = sum(wanted.values())
    if total <= room:
        return
    exact = {name: n * room / total for name, n in wanted.items()}
    given = {name: int(x) for name, x in exact.items()}
    order = sorted(exact, key=lambda name: (given[name] - exact[name], name))
    for name in order[: room - sum(given.values())]:
        given[name] += 1
    for name, n in given.items():
        if pool in cut[name]:
            cut[name][pool] = n


def team_shares(
    guarantee: Mapping[str, int],
    demand: Mapping[str, int],
    weight: Mapping[str, float],
    slots: int,
    kept: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """How many of a pool's ``slots`` each team gets.

    ``demand``: most slots the team's jobs can use here, already within its limits.
    Guarantees first (as far as demanded), then the slots each team ``kept`` above its
    guarantee (its loans, :func:`~tidal.policy.loan_order.pool_shares`), then one slot at a
    time to the team with the least extra per weight, ties to the lower name: integral
    weighted water-filling.
    """
    extra = {t: max(0, (kept or {}).get(t, 0)) for t in demand}
    shares = {t: min(max(0, guarantee.get(t, 0)), max(0, demand[t])) + extra[t] for t in demand}
    left = slots - sum(shares.values())
    # A heap of (the next slot's extra per weight, name): the lowest takes the next slot.
    heap = [
        ((extra[t] + 1) / _weight(weight, t), t) for t in sorted(demand) if demand[t] > shares[t]
    ]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, team = heapq.heappop(heap)
        extra[team] += 1
        shares[team] += 1
        left -= 1
        if shares[team] < demand[team]:
            heapq.heappush(heap, ((extra[team] + 1) / _weight(weight, team), team))
    return shares


def _weight(weight: Mapping[str, float], team: str) -> float:
    """A team's weight, never zero (a zero weight would divide by it)."""
    return max(weight.get(team, 1.0), 1e-9)


def loans(
    guarantee: Mapping[str, int], used: Mapping[str, int], slots: int
) -> tuple[dict[str, int], dict[str, int], list[tuple[str, str, int]]]:
    """Borrowed and lent slots per team in one pool, and who lends to whom.

    A team borrows what it uses above its guarantee; borrowers use the slots nobody is
    guaranteed first, and only the rest is lent from idle guarantees, lenders and
    borrowers paired in name order. Returns ``(borrowed, lent, [(lender, borrower, n)])``.
    """
    teams = sorted(set(guarantee) | set(used))
    borrowed = {t: max(0, used.get(t, 0) - guarantee.get(t, 0)) for t in teams}
    idle = {t: max(0, guarantee.get(t, 0) - used.get(t, 0)) for t in teams}
    unguaranteed = max(0, slots - sum(guarantee.values()))
    to_lend = max(0, sum(borrowed.values()) - unguaranteed)
    lent = dict.fromkeys(teams, 0)
    for team in teams:
        lent[team] = min(idle[team], to_lend)
        to_lend -= lent[team]
    # Pair lenders with borrowers; the unguaranteed slots count as lent by no one and
    # are matched last, so each loan names a real lender while any lends.
    pairs: list[tuple[str, str, int]] = []
    supply = [(t, lent[t]) for t in teams if lent[t]]
    need = [(t, borrowed[t]) for t in teams if borrowed[t]]
    i = j = 0
    while i < len(supply) and j < len(need):
        n = min(supply[i][1], need[j][1])
        pairs.append((supply[i][0], need[j][0], n))
        supply[i] = (supply[i][0], supply[i][1] - n)
        need[j] = (need[j][0], need[j][1] - n)
        if supply[i][1] == 0:
            i += 1
        if need[j][1] == 0:
            j += 1
    return borrowed, lent, pairs
