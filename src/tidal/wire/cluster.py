"""The cluster's bodies in the REST API: its hosts and who holds their slots, the hosts
being drained, each team's queue, and the cluster's use over time.

Shared by the server (``controller/routes/cluster.py``, ``host_drains.py``) and the SDK;
the jobs' bodies are :mod:`tidal.wire.schema`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tidal.wire.schema import RequestBody

__all__ = [
    "CheckpointOrderView",
    "ClusterView",
    "DrainRequest",
    "HostDrainView",
    "HostView",
    "PreemptionNotice",
    "TeamQueueView",
    "UtilisationPoint",
]


class DrainRequest(RequestBody):
    """``POST /cluster/hosts/{host}/drain``: the host goes within ``deadline`` seconds,
    if given (no deadline: its jobs move off as room allows)."""

    deadline: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)


class PreemptionNotice(RequestBody):
    """``POST /cluster/hosts/{host}/notice``: a cloud's notice that the host goes at
    ``at`` (seconds since the epoch)."""

    at: float = Field(gt=0)


class CheckpointOrderView(BaseModel):
    """A job that cannot leave a draining host in place: it checkpoints at ``at``, before
    the host goes at ``deadline``, and resumes elsewhere."""

    job: str
    at: float
    deadline: float


class HostDrainView(BaseModel):
    """A host being drained, and what is still on it."""

    requested_at: float
    #: When the host goes (seconds since the epoch); null: not known.
    leaves_at: float | None
    #: Who asked: ``admin``, ``notice`` (a cloud's preemption notice) or ``ray``.
    source: str
    #: Jobs with a live worker on the host; empty once the host is drained.
    remaining: list[str]
    checkpoints: list[CheckpointOrderView]


class HostView(BaseModel):
    """A host and which job holds each of its slots (null when free)."""

    name: str
    slots: int
    gpu: bool
    group: str | None
    labels: dict[str, str]
    used_by: list[str | None]
    #: Set while the host is being drained.
    draining: HostDrainView | None = None


class ClusterView(BaseModel):
    """The cluster the controller hands out."""

    policy: str
    total_slots: int
    used_slots: int
    hosts: list[HostView]


class TeamQueueView(BaseModel):
    """One team's queue: its quota and what it holds, borrows and lends now (slots)."""

    team: str
    guaranteed: int
    #: Most slots the team may hold (its hard or borrowing limit); ``None``: no limit.
    limit: int | None
    used: int
    borrowed: int
    lent: int


class UtilisationPoint(BaseModel):
    """From ``time`` on, ``used`` of the cluster's ``total`` slots were held by jobs."""

    time: float
    used: int
    total: int
