"""A job's states and the legal changes between them.

:class:`JobState` is where a job is in its life; :data:`TRANSITIONS` the changes the
system may make; :func:`check_transition` is the one place a state change is judged
legal, and the store calls it on every write. The job model (:mod:`tidal.model`)
re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType

__all__ = ["ACTIVE_STATES", "TRANSITIONS", "JobState", "JobStateError", "check_transition"]


class JobState(str, Enum):
    """A job's life: queued → running ⇄ rescaling → succeeded | failed | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    RESCALING = "rescaling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the job is over for good."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def holds_slots(self) -> bool:
        """Whether the job's workers occupy slots in this state."""
        return self in (JobState.RUNNING, JobState.RESCALING)


#: States of a job that is not over: the controller loop looks at these every tick.
ACTIVE_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.RESCALING)

_OVER = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

#: The legal changes of state. Staying in a state is always legal (a rescale while
#: rescaling, a reason updated while queued); leaving a terminal state never is.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        # Started on slots; failed when the backend cannot start it; cancelled.
        JobState.QUEUED: frozenset({JobState.RUNNING}) | _OVER,
        # Resized or a worker replaced; preempted or lost back to the queue; over.
        JobState.RUNNING: frozenset({JobState.RESCALING, JobState.QUEUED}) | _OVER,
        # Settled on its new slots; preempted or lost; over.
        JobState.RESCALING: frozenset({JobState.RUNNING, JobState.QUEUED}) | _OVER,
        JobState.SUCCEEDED: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.CANCELLED: frozenset(),
    }
)


class JobStateError(ValueError):
    """A change does not fit the job's current state (scaling a finished job, reviving
    a cancelled one)."""


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    """Raise :class:`JobStateError` unless a job may go from ``old`` to ``new``."""
    if new is not old and new not in TRANSITIONS[old]:
        raise JobStateError(f"job {job_id} is {old.value}; it cannot become {new.value}")
