"""The body of ``GET /cluster/usage``: every job's slots over time, for the cluster page's
stacked chart and for scripts."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["UsageMark", "UsageSeries", "UsageView"]


class UsageSeries(BaseModel):
    """One job's slots at each of the view's ``times`` (a step series: the count holds
    from that time until the next)."""

    job_id: str
    slots: list[int]


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
    use as a share of its ``total_slots`` (0-1) at the same times, and the marks."""

    since: float
    until: float
    total_slots: int
    times: list[float]
    jobs: list[UsageSeries]
    utilisation: list[float]
    marks: list[UsageMark]
