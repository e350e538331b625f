"""What users ask of a running job, recorded by the API and carried out by the loop.

The API never changes a job's desired state itself: it stores a request (a new priority,
a new size, some of its workers to stop, a cancel) and answers with it; on its next tick
the controller loop, the only writer of desired state, applies every pending request of
a job in the order they came (:func:`apply_requests`, a pure function) and removes them.
Until then the job's view shows the requested values
(:func:`tidal.controller.routes.views.job_view` applies the same function), so a caller
reads back what it asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.controller.store.records import JobRecord
from tidal.policy.api import Slot

__all__ = [
    "Cancel",
    "PendingRequest",
    "RequestedChanges",
    "Resize",
    "SetPriority",
    "StopWorkers",
    "UserRequest",
    "apply_requests",
    "request_from_row",
    "request_to_row",
]


@dataclass(frozen=True)
class SetPriority:
    """Give the job a new priority."""

    priority: int


@dataclass(frozen=True)
class Resize:
    """Give the job a new target size, ``target`` slots.

    ``how`` is the verb that asked (``scale``, ``scale_out``, ``scale_in``); a scale-out
    with a ``deadline`` is rolled back to the previous target when not reached by then.
    """

    target: int
    how: str = "scale"
    deadline: float | None = None


@dataclass(frozen=True)
class StopWorkers:
    """Stop these workers of a running job for good (:mod:`tidal.controller.loop.worker_stops`
    decides whether that is possible): the job gives up their ``slots``, and its ``role``
    runs as many fewer replicas: a fixed role's size drops (``fixed``), an elastic role's
    target does."""

    worker_ids: tuple[int, ...]
    slots: tuple[Slot, ...]
    role: str
    fixed: bool


@dataclass(frozen=True)
class Cancel:
    """Stop the job for good."""


UserRequest = SetPriority | Resize | StopWorkers | Cancel


@dataclass(frozen=True)
class PendingRequest:
    """A request recorded and not applied yet."""

    id: int
    job_id: str
    time: float
    request: UserRequest


@dataclass(frozen=True)
class RequestedChanges:
    """The job columns a job's pending requests change, and the requests they consume."""

    changes: Mapping[str, Any]
    applied: tuple[int, ...]


def request_to_row(request: UserRequest) -> tuple[str, dict[str, Any]]:
    """The ``(kind, data)`` a request is stored as."""
    if isinstance(request, SetPriority):
        return "priority", {"priority": request.priority}
    if isinstance(request, Resize):
        return "resize", {
            "target_slots": request.target,
            # The same count under its former name, for readers of ``pending_requests``
            # (deprecated: it goes in the next release).
            "workers": request.target,
            "how": request.how,
            "deadline": request.deadline,
        }
    if isinstance(request, StopWorkers):
        return "stop_workers", {
            "worker_ids": list(request.worker_ids),
            "slots": [[host, index] for host, index in request.slots],
            "role": request.role,
            "fixed": request.fixed,
        }
    return "cancel", {}


def request_from_row(kind: str, data: Mapping[str, Any]) -> UserRequest:
    """The request stored as ``(kind, data)``; ``ValueError`` for a kind this tidal lacks."""
    if kind == "priority":
        return SetPriority(int(data["priority"]))
    if kind == "resize":
        deadline = data.get("deadline")
        return Resize(
            # ``workers``: a request stored by the release before, pending at its upgrade.
            int(data["target_slots"] if "target_slots" in data else data["workers"]),
            str(data.get("how", "scale")),
            float(deadline) if deadline is not None else None,
        )
    if kind == "stop_workers":
        return StopWorkers(
            tuple(int(i) for i in data["worker_ids"]),
            tuple((str(host), int(index)) for host, index in data["slots"]),
            str(data["role"]),
            bool(data["fixed"]),
        )
    if kind == "cancel":
        return Cancel()
    raise ValueError(f"unknown request kind {kind!r}")


def apply_requests(job: JobRecord, pending: Sequence[PendingRequest]) -> RequestedChanges:
    """The changes ``pending`` (oldest first) make to ``job``.

    Later requests of a kind supersede earlier ones; a scale-out remembers the target it
    replaced, to restore it if its deadline passes. Stopping workers adds their slots to
    the ones the job gives up and lowers its size by as many: a fixed role's replicas (and
    so the job's bounds), or the elastic role's target (from the slots the job holds).
    """
    changes: dict[str, Any] = {}
    target = job.target_slots
    low, high = job.min_slots, job.max_slots
    release = list(job.release_slots)
    stopped = dict(job.stopped_replicas)
    for item in pending:
        request = item.request
        if isinstance(request, SetPriority):
            changes["priority"] = request.priority
        elif isinstance(request, Resize):
            rollback = request.how == "scale_out" and request.deadline is not None
            changes.update(
                target_slots=request.target,
                scale_deadline=request.deadline if rollback else None,
                scale_previous=target if rollback else None,
            )
            target = request.target
        elif isinstance(request, StopWorkers):
            gone = [s for s in request.slots if s not in release]
            release += gone
            if request.fixed:
                stopped[request.role] = stopped.get(request.role, 0) + len(gone)
                low, high = low - len(gone), high - len(gone)
                target = None if target is None else max(low, min(target - len(gone), high))
                changes.update(
                    min_slots=low,
                    max_slots=high,
                    target_slots=target,
                    stopped_replicas=dict(stopped),
                )
            else:
                held = len(job.slots) if target is None else min(target, len(job.slots))
                target = max(low, held - len(gone))
                changes.update(target_slots=target, scale_deadline=None, scale_previous=None)
            changes["release_slots"] = tuple(release)
        else:
            changes["cancel_requested"] = True
    return RequestedChanges(changes=changes, applied=tuple(p.id for p in pending))
