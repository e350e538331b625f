"""What the store hands out: detached, immutable snapshots of its rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from tidal.controller.store.stored_specs import load_stored_spec
from tidal.controller.store.tables import JobRow, slots_of
from tidal.launch.api import WorkerState
from tidal.model import DEFAULT_OWNER, DEFAULT_TEAM, Job, Replicas, job_from_spec
from tidal.model_states import JobState
from tidal.policy.api import Slot
from tidal.spec import JobSpec

__all__ = [
    "AllocationRecord",
    "Event",
    "EventRecord",
    "GoodputRecord",
    "JobRecord",
    "MetricRecord",
    "WorkerRecord",
    "without_stopped",
]


@dataclass(frozen=True)
class JobRecord:
    """A job as stored (a detached snapshot): the submitted job and where it stands.

    ``name``, ``labels``, ``target_group`` and the worker bounds are columns of their own
    so jobs can be listed and filtered without reading every spec; :attr:`job` is the
    whole job model.
    """

    id: str
    name: str
    #: The spec as stored (JSON); :attr:`spec` parses it on first use.
    spec_data: Mapping[str, Any]
    state: JobState
    reason: str
    priority: int
    target_group: str | None
    labels: Mapping[str, str]
    min_slots: int
    max_slots: int
    target_slots: int | None
    scale_deadline: float | None
    scale_previous: int | None
    slots: tuple[Slot, ...]
    reallocations: int
    restarts: int
    cancel_requested: bool
    attained_service: float
    rescale_started_at: float | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    owner: str = DEFAULT_OWNER
    team: str = DEFAULT_TEAM
    #: Slots of workers a user stopped, which the job gives up at its next allocation.
    release_slots: tuple[Slot, ...] = ()
    #: Replicas of each fixed role a user stopped for good (the model runs that many fewer).
    stopped_replicas: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def spec(self) -> JobSpec:
        """The job's spec, read as stored: one that earlier, more lenient rules accepted
        still loads (:func:`~tidal.controller.store.stored_specs.load_stored_spec`)."""
        return load_stored_spec(self.spec_data)

    @cached_property
    def job(self) -> Job:
        """The job model, with the priority the job has now."""
        job = job_from_spec(self.spec, job_id=self.id, owner=self.owner, team=self.team)
        return without_stopped(replace(job, priority=self.priority), self.stopped_replicas)

    @classmethod
    def of_row(cls, row: JobRow) -> JobRecord:
        """The record of a job's row."""
        return cls(
            id=row.id,
            name=row.name,
            spec_data=row.spec,
            state=JobState(row.state),
            reason=row.reason,
            priority=row.priority,
            target_group=row.target_group,
            labels=dict(row.labels or {}),
            min_slots=row.min_slots,
            max_slots=row.max_slots,
            target_slots=row.target_slots,
            scale_deadline=row.scale_deadline,
            scale_previous=row.scale_previous,
            slots=slots_of(row.slots or []),
            reallocations=row.reallocations,
            restarts=row.restarts,
            cancel_requested=row.cancel_requested,
            attained_service=row.attained_service,
            rescale_started_at=row.rescale_started_at,
            submitted_at=row.submitted_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            updated_at=row.updated_at,
            owner=row.owner,
            team=row.team,
            release_slots=slots_of(row.release_slots or []),
            stopped_replicas={str(k): int(v) for k, v in (row.stopped_replicas or {}).items()},
        )


def without_stopped(job: Job, stopped: Mapping[str, int]) -> Job:
    """``job`` with ``stopped[role]`` fewer replicas of each of those roles: what it runs
    once a user stopped some of its workers for good (:mod:`tidal.controller.loop.worker_stops`).
    """
    if not stopped:
        return job
    roles = []
    for role in job.roles:
        cut = stopped.get(role.name, 0)
        r = role.replicas
        if cut > 0 and r.max - cut >= 1:
            top = r.max - cut
            role = replace(
                role, replicas=Replicas(min=min(r.min, top), max=top, initial=min(r.initial, top))
            )
        roles.append(role)
    return replace(job, roles=tuple(roles))


@dataclass(frozen=True)
class WorkerRecord:
    """The last known state of one worker."""

    job_id: str
    worker_id: int
    slot: Slot
    pid: int | None
    state: WorkerState
    exit_code: int | None
    updated_at: float
    #: The role it is a replica of and its index there (``None``: not known).
    role: str = "worker"
    index: int | None = None
    #: Every slot it holds, when more than one (all on ``slot``'s host); empty: ``slot``.
    slots: tuple[Slot, ...] = ()

    @property
    def held(self) -> tuple[Slot, ...]:
        """Every slot the worker holds."""
        return self.slots or (self.slot,)


@dataclass(frozen=True)
class EventRecord:
    """Something that happened, for the user to read (``tidal get``, the events API)."""

    id: int
    job_id: str | None
    time: float
    kind: str
    message: str
    data: Mapping[str, Any]
    #: Who made the change (``None``: the server) and through what (``cli``, ``api``,
    #: ``dashboard``).
    actor: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class AllocationRecord:
    """From ``time`` on, the job held ``slots`` (``count`` of them); what charts draw."""

    job_id: str
    time: float
    count: int
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class MetricRecord:
    """Training metrics a job reported at one step."""

    job_id: str
    step: int
    time: float
    values: Mapping[str, float]


@dataclass(frozen=True)
class GoodputRecord:
    """The newest goodput report of a job's workers (see ``tidal.runtime.adaptive``):
    fitted throughput model, gradient noise scale, chosen batch, efficiency, speed-up."""

    job_id: str
    time: float
    report: Mapping[str, Any]


@dataclass(frozen=True)
class Event:
    """An event to record together with a job change, in the same transaction."""

    kind: str
    message: str = ""
    data: Mapping[str, Any] | None = None
    #: Who asked for the change and through what (``None``: the server's own).
    actor: str | None = None
    source: str | None = None
