"""``GET /cluster/usage``: every job's slots over time, priority changes and rescales
marked, the cluster's utilisation, and with team queues each team's slots against its
guarantee and limit, from the allocation timeline and the events the store already
records."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Annotated

from fastapi import APIRouter, Query

from tidal.controller.routes.deps import ControllerDep
from tidal.controller.routes.errors import ProtectedRoute
from tidal.controller.store.records import AllocationRecord, EventRecord
from tidal.policy.teams import TeamUsage, loans
from tidal.wire.usage import TeamUsageSeries, UsageMark, UsageSeries, UsageView

__all__ = ["MARKED", "router", "team_series", "usage_view"]

router = APIRouter(tags=["cluster"], route_class=ProtectedRoute)

#: The events drawn as marks, by kind: a priority set by a user, and each change of a
#: job's slots by the loop (placed, resumed, rescaled, preempted).
MARKED = ("priority", "started", "resumed", "rescale", "preempted")
#: Marks sent at most (the latest): a chart of more is unreadable anyway.
MAX_MARKS = 5000


def usage_view(
    allocations: Sequence[AllocationRecord],
    events: Sequence[EventRecord],
    total_slots: int,
    since: float | None,
    until: float,
) -> UsageView:
    """Each job's slots at every time one changed between ``since`` (or the first
    allocation, when later or ``since`` is ``None``) and ``until``, from the whole
    allocation timeline in time order (the level at ``since`` is the last point before
    it); the cluster's utilisation at the same times, and the marked ``events`` of the
    window."""
    first = allocations[0].time if allocations else until
    # Nothing was held before the first allocation: the view starts there at the earliest.
    start = min(max(since, first) if since is not None else first, until)
    level: dict[str, int] = {}
    times: list[float] = [start]
    rows: list[dict[str, int]] = [{}]
    for a in allocations:
        if a.time > until:
            break
        if a.time <= start:
            level[a.job_id] = a.count
            rows[0] = dict(level)
            continue
        level[a.job_id] = a.count
        if times[-1] == a.time:
            rows[-1] = dict(level)  # several jobs changed in one tick: the state after all
        else:
            times.append(a.time)
            rows.append(dict(level))
    if times[-1] < until:
        times.append(until)  # the last level, held until now
        rows.append(dict(rows[-1]))
    jobs = sorted({job for row in rows for job, count in row.items() if count > 0})
    series = [UsageSeries(job_id=job, slots=[row.get(job, 0) for row in rows]) for job in jobs]
    used = [sum(row.values()) for row in rows]
    marks = [
        UsageMark(time=e.time, job_id=e.job_id, kind=e.kind, message=e.message)
        for e in events
        if e.kind in MARKED and e.job_id is not None and start <= e.time <= until
    ][-MAX_MARKS:]
    return UsageView(
        since=start,
        until=until,
        total_slots=total_slots,
        times=times,
        jobs=series,
        utilisation=[u / total_slots if total_slots else 0.0 for u in used],
        marks=marks,
    )


def team_series(
    view: UsageView, team_of: Mapping[str, str], standing: Sequence[TeamUsage]
) -> list[TeamUsageSeries]:
    """Each team's slots at the view's times (its jobs' summed, ``team_of`` naming each
    job's team), and what it borrowed and lent then against ``standing``'s guarantees
    (the team queues' latest decision: guarantees as fitted to the pool now).

    Loans are counted over the whole pool, as :func:`~tidal.policy.teams.loans` counts
    one pool. No ``standing`` (no team queues): no series."""
    if not standing:
        return []
    quota = {u.team: u for u in standing}
    teams = sorted(set(quota) | {team_of.get(s.job_id, "") for s in view.jobs} - {""})
    used = {team: [0] * len(view.times) for team in teams}
    for series in view.jobs:
        team = team_of.get(series.job_id)
        if team is None:
            continue  # a job the store no longer holds: no team to count it in
        for i, n in enumerate(series.slots):
            used[team][i] += n
    guarantee = {team: quota[team].guaranteed if team in quota else 0 for team in teams}
    borrowed = {team: [0] * len(view.times) for team in teams}
    lent = {team: [0] * len(view.times) for team in teams}
    for i in range(len(view.times)):
        took, gave, _ = loans(guarantee, {t: used[t][i] for t in teams}, view.total_slots)
        for team in teams:
            borrowed[team][i] = took[team]
            lent[team][i] = gave[team]
    return [
        TeamUsageSeries(
            team=team,
            guaranteed=guarantee[team],
            limit=quota[team].limit if team in quota else None,
            slots=used[team],
            borrowed=borrowed[team],
            lent=lent[team],
        )
        for team in teams
    ]


@router.get("/cluster/usage", response_model=UsageView)
def cluster_usage(
    controller: ControllerDep,
    since: Annotated[float | None, Query(description="Unix time; default: all")] = None,
) -> UsageView:
    """Every job's slots over time (a step series per job, for a stacked chart), the
    cluster's utilisation at the same times, priority changes and rescales marked, and
    with team queues each team's slots against its guarantee and limit."""
    store = controller.store
    events = store.events(since=since, limit=MAX_MARKS * 4)
    view = usage_view(
        store.allocations(), events, controller.cluster.total_slots, since, time.time()
    )
    standing = controller.teams.usage
    if standing:
        team_of = store.job_teams([s.job_id for s in view.jobs])
        view.teams = team_series(view, team_of, standing)
    return view
