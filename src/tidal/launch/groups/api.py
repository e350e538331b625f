"""What a group of workers is to whoever drives it: the :class:`Group` protocol, and the
:class:`Outcome` and :class:`GroupEvent` every group reports.

Four groups implement it: :class:`~tidal.launch.groups.elastic.WorkerGroup` (the rescale protocol,
resized in place), :class:`~tidal.launch.groups.torchrun.TorchrunGroup` (torchrun's environment,
resized by restart), :class:`~tidal.launch.groups.replicas.ReplicaSet` (one role's plain
replicas) and :class:`~tidal.launch.groups.roles.RoleGroups` (a multi-role job, one group
per role). A driver (:class:`~tidal.launch.driver.GroupDriver`, behind ``tidal run``, the
local backend's agent and the Ray backend) sees a job's group only as a :class:`JobGroup`:
the group that hosts the job's store.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tidal.launch.worker import Worker
    from tidal.runtime.rendezvous import Generation, RendezvousHost

__all__ = ["Group", "GroupEvent", "JobGroup", "Outcome"]


class Outcome(enum.Enum):
    """How a group ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class GroupEvent:
    """Something that happened to the group, for logs and the controller's event table."""

    kind: str  # started, admitted, released, failed, restarted, generation, finished
    message: str
    time: float = field(default_factory=time.time)
    generation: int | None = None
    stall: float | None = None


@runtime_checkable
class Group(Protocol):
    """Workers run on assigned slots, advanced by :meth:`poll` until an outcome.

    A group decides nothing about how many slots it gets, nor whether a failed worker is
    replaced: the slot of a failed worker waits until :meth:`assign` lists it again."""

    @property
    def workers(self) -> Mapping[str, Worker]:
        """Every worker the group started, by id (``w<K>``), exited ones included."""
        ...

    @property
    def outcome(self) -> Outcome | None:
        """How the group ended; ``None`` while it runs."""
        ...

    def start(self, slots: Sequence[str]) -> None:
        """Start workers on ``slots`` (the first assignment)."""
        ...

    def assign(self, slots: Sequence[str]) -> None:
        """Run on exactly ``slots`` from the next :meth:`poll` on."""
        ...

    def poll(self) -> Outcome | None:
        """Advance: reap exits, start and stop workers; the outcome once there is one."""
        ...

    def poll_interval(self) -> float:
        """Seconds a caller may wait before the next :meth:`poll`."""
        ...

    def settled(self) -> bool:
        """Whether the workers run on the assigned slots with no change in flight."""
        ...

    def fail(self, reason: str) -> None:
        """End the group as failed (the restart budget is spent): kill every worker."""
        ...

    def stop(self, grace: float = 30.0) -> None:
        """Stop every worker, killing what is left after ``grace`` seconds; close logs."""
        ...


@runtime_checkable
class JobGroup(Group, Protocol):
    """A group that runs a whole job: it hosts the job's store (where the workers meet,
    report and are asked to resize) and numbers the job's generations."""

    @property
    def host(self) -> RendezvousHost:
        """The job's store."""
        ...

    @property
    def generation(self) -> Generation | None:
        """The current generation (``None`` before the first)."""
        ...
