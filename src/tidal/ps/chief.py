"""What the chief of a parameter-server job decides from the servers' view of the workers.

Each server reports every worker it has heard of as ``active`` (heard from within the
peer timeout), ``finished`` (it said ``leave``: its script closed the model, its training
ended) or ``lost`` (silent: crashed, killed, or stopped by a shrink; it may be restarted
under the same id), with how long each lost one has been silent. A worker is what the
servers together say: active if any server hears it, else finished if any saw it leave.
Training is over when at least one worker joined, none is active, and every one finished
(or, with a ``lost_grace``, has been lost for longer than that: not coming back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WorkerStates", "merge_statuses", "training_over"]

_RANK = {"lost": 0, "finished": 1, "active": 2}


@dataclass(frozen=True)
class WorkerStates:
    """The job's workers as the servers see them."""

    #: worker id -> ``active``, ``finished`` or ``lost``
    states: dict[str, str] = field(default_factory=dict)
    #: lost worker id -> seconds it has been silent (the shortest any server saw)
    lost_for: dict[str, float] = field(default_factory=dict)


def merge_statuses(statuses: Iterable[Mapping[str, Any]]) -> WorkerStates:
    """One view from every server's ``status`` answer (``workers``, ``lost_for``)."""
    states: dict[str, str] = {}
    lost_for: dict[str, float] = {}
    for status in statuses:
        for worker, state in dict(status.get("workers", {})).items():
            if _RANK.get(state, 0) >= _RANK.get(states.get(worker, "lost"), 0):
                states[worker] = str(state)
        for worker, seconds in dict(status.get("lost_for", {})).items():
            lost_for[worker] = min(float(seconds), lost_for.get(worker, float("inf")))
    lost = {w: s for w, s in lost_for.items() if states.get(w) == "lost"}
    return WorkerStates(states, lost)


def training_over(view: WorkerStates, lost_grace: float | None = None) -> bool:
    """Whether the workers' training is over (module docstring). Without ``lost_grace``
    a lost worker keeps it going: it may be restarted and go on."""
    if "finished" not in view.states.values():
        return False
    for worker, state in view.states.items():
        if state == "active":
            return False
        if state == "lost" and (lost_grace is None or view.lost_for.get(worker, 0.0) < lost_grace):
            return False
    return True
