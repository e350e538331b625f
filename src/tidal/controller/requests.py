"""What users ask of a running job, recorded by the API and carried out by the loop.

The API never changes a job's desired state itself: it stores a request (a new priority,
a new size, a cancel) and answers with it; on its next tick the controller loop, the only
writer of desired state, applies every pending request of a job in the order they came
(:func:`apply_requests`, a pure function) and removes them. Until then the job's view
shows the requested values (:func:`tidal.controller.api.views.job_view` applies the same
function), so a caller reads back what it asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Cancel",
    "PendingRequest",
    "RequestedChanges",
    "Resize",
    "SetPriority",
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
    """Give the job a new target size.

    ``how`` is the verb that asked (``scale``, ``scale_out``, ``scale_in``); a scale-out
    with a ``deadline`` is rolled back to the previous target when not reached by then.
    """

    workers: int
    how: str = "scale"
    deadline: float | None = None


@dataclass(frozen=True)
class Cancel:
    """Stop the job for good."""


UserRequest = SetPriority | Resize | Cancel


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
            "workers": request.workers,
            "how": request.how,
            "deadline": request.deadline,
        }
    return "cancel", {}


def request_from_row(kind: str, data: Mapping[str, Any]) -> UserRequest:
    """The request stored as ``(kind, data)``; ``ValueError`` for a kind this tidal lacks."""
    if kind == "priority":
        return SetPriority(int(data["priority"]))
    if kind == "resize":
        deadline = data.get("deadline")
        return Resize(
            int(data["workers"]),
            str(data.get("how", "scale")),
            float(deadline) if deadline is not None else None,
        )
    if kind == "cancel":
        return Cancel()
    raise ValueError(f"unknown request kind {kind!r}")


def apply_requests(
    target_workers: int | None, pending: Sequence[PendingRequest]
) -> RequestedChanges:
    """The changes ``pending`` (oldest first) make to a job whose target is ``target_workers``.

    Later requests of a kind supersede earlier ones; a scale-out remembers the target it
    replaced, to restore it if its deadline passes.
    """
    changes: dict[str, Any] = {}
    target = target_workers
    for item in pending:
        request = item.request
        if isinstance(request, SetPriority):
            changes["priority"] = request.priority
        elif isinstance(request, Resize):
            rollback = request.how == "scale_out" and request.deadline is not None
            changes.update(
                target_workers=request.workers,
                scale_deadline=request.deadline if rollback else None,
                scale_previous=target if rollback else None,
            )
            target = request.workers
        else:
            changes["cancel_requested"] = True
    return RequestedChanges(changes=changes, applied=tuple(p.id for p in pending))
