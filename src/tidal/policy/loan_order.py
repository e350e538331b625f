"""Which loans a pool takes back first: the newest.

A team's jobs hold its guarantee first and its loan after, in the order they started: the
slots of its jobs started last are its loan. When teams take their guarantees back, the
loans are cut newest first across teams, each job down to its minimum, and only once every
borrowing job is at its minimum are jobs preempted, again newest first. A loan is kept
otherwise: the slots left over (idle, or given back) go to the teams that can use more by
weight (:func:`~tidal.policy.teams.team_shares`), so a borrowing team does not take slots
from another borrower, only from the idle pool.

Pure functions over :class:`Holding`; :mod:`tidal.policy.team_queues` builds them from the
jobs and the previous allocation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.policy.api import JobRequest
from tidal.policy.teams import team_shares

__all__ = ["Holding", "holding", "kept_sizes", "pool_shares"]


@dataclass(frozen=True)
class Holding:
    """One job's slots in a pool before a decision, as the loan order reads them.

    ``since`` orders loans: the job that started first holds the oldest one.
    """

    job_id: str
    team: str
    held: int
    min_slots: int
    since: tuple[float, float, str]


def holding(job: JobRequest, held: int) -> Holding:
    """``job``'s holding of ``held`` slots; a job not started counts as started last."""
    started = job.started_at if job.started_at is not None else math.inf
    return Holding(
        job.job_id, job.team, held, job.min_slots, (started, job.submitted_at, job.job_id)
    )


@dataclass(frozen=True)
class _Loan:
    """The part of one job's slots above its team's guarantee."""

    since: tuple[float, float, str]
    team: str
    slots: int
    #: Of ``slots``, those above the job's minimum: given back by shrinking the job.
    above_min: int


def pool_shares(
    guarantee: Mapping[str, int],
    demand: Mapping[str, int],
    weight: Mapping[str, float],
    slots: int,
    holdings: Sequence[Holding],
) -> dict[str, int]:
    """How many of a pool's ``slots`` each team gets, keeping loans and reclaiming the
    newest first.

    ``demand``: most slots each team's jobs can use here, within its limits. Every team
    gets its guarantee as far as demanded; the loans held (``holdings``) are kept while the
    slots left allow, cut newest first where they do not; any slots left over are shared by
    weight.
    """
    base = {t: min(max(0, guarantee.get(t, 0)), max(0, demand[t])) for t in demand}
    loans = _loans(base, demand, holdings)
    kept = dict.fromkeys(demand, 0)
    for loan in loans:
        kept[loan.team] += loan.slots
    over = sum(kept.values()) - (slots - sum(base.values()))
    newest_first = sorted(loans, key=lambda loan: loan.since, reverse=True)
    # Shrink every loan's job to its minimum, newest first; only then preempt, newest first.
    for loan in newest_first:
        given = min(max(0, over), loan.above_min)
        kept[loan.team] -= given
        over -= given
    for loan in newest_first:
        given = min(max(0, over), loan.slots - loan.above_min)
        kept[loan.team] -= given
        over -= given
    return team_shares(guarantee, demand, weight, slots, kept=kept)


def _loans(
    base: Mapping[str, int], demand: Mapping[str, int], holdings: Sequence[Holding]
) -> list[_Loan]:
    """Each job's slots above its team's guarantee (``base``), within the team's demand."""
    loans: list[_Loan] = []
    for team in sorted(demand):
        count = 0
        for h in sorted((h for h in holdings if h.team == team), key=lambda h: h.since):
            held = min(h.held, max(0, demand[team] - count))
            loan = count + held - max(count, base[team])
            if loan > 0:
                # A job shrinks from its top, so its loan is its highest slots.
                loans.append(_Loan(h.since, team, loan, min(loan, max(0, held - h.min_slots))))
            count += held
    return loans


def kept_sizes(holdings: Sequence[Holding], share: int) -> dict[str, int]:
    """How many slots each of a team's jobs keeps when the team's ``share`` is below what
    they hold: its newest job shrinks first, each down to its minimum, and only then are
    jobs preempted, newest first (a preempted job's slots beyond what was needed go back
    to the older jobs)."""
    oldest_first = sorted(holdings, key=lambda h: h.since)
    size = {h.job_id: h.held for h in oldest_first}
    over = sum(size.values()) - share
    for h in reversed(oldest_first):
        given = min(max(0, over), max(0, h.held - h.min_slots))
        size[h.job_id] -= given
        over -= given
    for h in reversed(oldest_first):
        if over <= 0:
            break
        over -= size[h.job_id]
        size[h.job_id] = 0
    for h in oldest_first:
        if over >= 0:
            break
        if size[h.job_id]:
            back = min(-over, h.held - size[h.job_id])
            size[h.job_id] += back
            over += back
    return size
