"""The body of ``GET /cluster/usage``: every job's slots over time, and each team's against
its guarantee and limit, for the cluster page's charts and for scripts."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["TeamUsageSeries", "UsageMark", "UsageSeries", "UsageView"]


class UsageSeries(BaseModel):
    """One job's slots at each of the view's ``times`` (a step series: the count holds
    from that time until the next)."""

    job_id: str
    slots: list[int]


class TeamUsageSeries(BaseModel):
    """One team's slots at each of the view's ``times`` (the sum over its jobs), with the
    slots it borrowed and lent then, measured against its guarantee as fitted to the
    pool now; ``guaranteed`` and ``limit`` (``None``: no limit) are today's, one level
    over the whole window."""

    team: str
    guaranteed: int
    limit: int | None
    slots: list[int]
    borrowed: list[int]
    lent: list[int]


class UsageMark(BaseModel):
    """A moment worth marking on the chart: a job's priority changed (``priority``) or
    its slots did (``started``, ``resumed``, ``rescale``, ``preempted``)."""

    time: float
    job_id: str
    kind: str
    message: str


class UsageView(BaseModel):
    """From ``since`` (the one asked for, or the first allocation when later) to ``until``
    (now): the times any job's slots changed, each job's slots at
    those times (jobs that held none in the window are left out), the cluster's slots in
    use as a share of its ``total_slots`` (0-1) at the same times, and the marks. With
    team queues (``tidal server --teams``), ``teams`` holds each team's series (every
    configured team, and the team of any job in the window); empty without them."""

    since: float
    until: float
    total_slots: int
    times: list[float]
    jobs: list[UsageSeries]
    utilisation: list[float]
    marks: list[UsageMark]
    teams: list[TeamUsageSeries] = []
