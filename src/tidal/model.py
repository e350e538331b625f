"""The job as the whole system sees it: who owns it, its roles, and the states it goes through.

A :class:`Job` is built once from a submitted spec (:func:`job_from_spec`); the store keeps
it, the controller turns it into the policy's request and the backend's launch, the API
into its view. Each of those is a conversion *of this one object*, written once where that
layer lives, rather than a copy of the spec's fields.

A job written without ``roles:`` has one role, ``worker``: ``replicas`` identical
processes that form one elastic data-parallel group. A spec with ``roles:`` gives several
(a chief, parameter servers and workers), at most one of them elastic; :attr:`Job.role`
reads the one that scales.

:class:`JobState` and its transition table (:mod:`tidal.model_states`) are re-exported
here, the names users and tests import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING

from tidal.model_states import (
    ACTIVE_STATES,
    TRANSITIONS,
    JobState,
    JobStateError,
    check_transition,
)

if TYPE_CHECKING:  # the spec imports pydantic and yaml; the model itself needs neither
    from tidal.spec import JobSpec
    from tidal.spec_roles import RoleSpec

__all__ = [
    "ACTIVE_STATES",
    "DEFAULT_OWNER",
    "DEFAULT_TEAM",
    "TRANSITIONS",
    "WORKER_ROLE",
    "Checkpointing",
    "Job",
    "JobState",
    "JobStateError",
    "Launcher",
    "Placement",
    "Replicas",
    "Resources",
    "RestartKind",
    "RestartPolicy",
    "Role",
    "check_transition",
    "job_from_spec",
    "stops_alone",
]

#: Every job belongs to the single administrator until the server knows more users.
DEFAULT_OWNER = "admin"
DEFAULT_TEAM = "default"
#: The name of the only role of an elastic data-parallel job.
WORKER_ROLE = "worker"


class Launcher(str, Enum):
    """What starts a role's processes and forms their group.

    ``tidal`` runs the rescale protocol (in-place resize); ``torchrun`` gives an unmodified
    script torchrun's environment and resizes by restarting every worker. A spec may name
    any of these; which ones a server can start is :mod:`tidal.controller.support`'s answer.

    What a launcher implies for the rest of the system is read from its properties
    (:attr:`forms_group`, :attr:`restart_based`, :attr:`runs_replicas`,
    :attr:`fixed_count`), never from a list of launchers kept elsewhere.
    """

    #: tidal's own runtime: the group resizes in place.
    TIDAL = "tidal"
    #: The environment torchrun gives a script (RANK, WORLD_SIZE, MASTER_ADDR, ...).
    TORCHRUN = "torchrun"
    #: ``TF_CONFIG`` as the TFJob operator writes it.
    TF = "tf"
    #: A launcher process handed its workers' host list (horovodrun, mpirun).
    MPI = "mpi"
    #: tidal's parameter-server runtime.
    PS = "ps"

    @property
    def forms_group(self) -> bool:
        """Whether the role's replicas form one group that runs the launcher's own
        protocol (tidal's rescale protocol, torchrun's restarts): a job has at most one
        such role, and a one-role job of it runs as that one group."""
        return self in (Launcher.TIDAL, Launcher.TORCHRUN)

    @property
    def restart_based(self) -> bool:
        """Whether a resize (or a failure) restarts every worker of the role."""
        return self is Launcher.TORCHRUN

    @property
    def runs_replicas(self) -> bool:
        """Whether the role runs as a set of plain replicas the launch layer starts one
        by one with the launcher's environment (``TF_CONFIG``, a hostfile, the
        parameter-server contract), even in a one-role job."""
        return not self.forms_group

    @property
    def fixed_count(self) -> bool:
        """Whether the role's replica count is fixed: its replicas find each other at
        addresses every one of them is given at start (``TF_CONFIG`` lists them all)."""
        return self is Launcher.TF

    @property
    def resize_mode(self) -> str:
        """How the role resizes, in the words the CLI shows."""
        return "restart-based resize" if self.restart_based else "in-place resize"


class RestartKind(str, Enum):
    """When a role's failed replicas are restarted: Kubeflow's restart policies."""

    #: A replica that exits non-zero fails the job.
    NEVER = "Never"
    #: A replica that exits non-zero is restarted, within the restart budget.
    ON_FAILURE = "OnFailure"
    #: A replica is restarted whenever it exits.
    ALWAYS = "Always"
    #: Restarted on retryable exit codes only (Kubeflow: 130, 137, 138, 143).
    EXIT_CODE = "ExitCode"


@dataclass(frozen=True)
class Replicas:
    """How many processes a role runs: at least ``min``, at most ``max``, starting at
    ``initial`` when slots allow."""

    min: int = 1
    max: int = 1
    initial: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.initial <= self.max:
            raise ValueError(
                f"replicas must satisfy 1 ≤ min ≤ initial ≤ max "
                f"(got min={self.min}, initial={self.initial}, max={self.max})"
            )

    @property
    def elastic(self) -> bool:
        """Whether the role may change size while it runs."""
        return self.min != self.max


@dataclass(frozen=True)
class Resources:
    """What one process of a role needs. It holds one slot per GPU, all on one host, and
    one slot when it needs none (a CPU slot)."""

    gpus: int = 1
    #: CPUs, or ``None``: none reserved, the worker not confined.
    cpus: float | None = None
    #: Bytes, or ``None`` for no limit.
    memory: int | None = None

    @property
    def slots(self) -> int:
        """Slots one process holds."""
        return max(1, self.gpus)


@dataclass(frozen=True)
class RestartPolicy:
    """When the role's replicas restart, and how many failures the job survives."""

    max_restarts: int = 3
    policy: RestartKind = RestartKind.ON_FAILURE


@dataclass(frozen=True)
class Role:
    """One kind of process in a job and how many of it run."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: Relative paths in ``command`` are relative to this directory.
    working_dir: str | None = None
    resources: Resources = field(default_factory=Resources)
    replicas: Replicas = field(default_factory=Replicas)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    launcher: Launcher = Launcher.TIDAL
    #: Whether the job succeeds once every replica of this role exited 0 (Kubeflow's
    #: successPolicy: the chief's success, or all workers').
    ends_job: bool = True


@dataclass(frozen=True)
class Placement:
    """Where a job may run: a resource group, and node labels every host must carry."""

    group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often a job's workers write durable checkpoints (0: never)."""

    #: ``None``: the job's own directory on the server; relative: to the working dir.
    dir: str | None = None
    every_steps: int = 0
    every_seconds: float = 300.0


@dataclass(frozen=True)
class Job:
    """A job as submitted: identity, ownership, roles and how it may be scheduled.

    ``id`` is empty until the store assigns one; ``priority`` is the priority the job was
    submitted with (the store's record holds the current one, which users may change).
    """

    name: str
    roles: tuple[Role, ...]
    id: str = ""
    owner: str = DEFAULT_OWNER
    team: str = DEFAULT_TEAM
    priority: int = 5000
    placement: Placement = field(default_factory=Placement)
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    #: The user's own labels, for filtering (not placement: see :attr:`placement`).
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [r.name for r in self.roles]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a job needs roles with distinct names (got {names})")

    @property
    def role(self) -> Role:
        """The role that scales: the elastic one, else the first (a one-role job's only)."""
        return next((r for r in self.roles if r.replicas.elastic), self.roles[0])

    @cached_property
    def gang_slots(self) -> tuple[int, ...]:
        """The slots each replica of the roles beside :attr:`role` holds (they are placed
        together or not at all: a gang); empty for a one-role job."""
        scaling = self.role
        return tuple(
            r.resources.slots for r in self.roles if r is not scaling for _ in range(r.replicas.max)
        )

    def slots_for(self, replicas: int) -> int:
        """Slots the whole job holds when :attr:`role` runs ``replicas`` replicas."""
        return sum(self.gang_slots) + replicas * self.role.resources.slots

    def workers_of(self, slots: int) -> int:
        """How many processes ``slots`` slots of the whole job run, as users count them:
        one a slot when every replica holds one; else every fixed replica plus the
        workers of :attr:`role` (``2`` for 4 slots of 2-GPU workers)."""
        if all(r.resources.slots == 1 for r in self.roles):
            return slots
        return len(self.gang_slots) + self.replicas_in(slots)

    def replicas_in(self, slots: int) -> int:
        """How many replicas of :attr:`role` ``slots`` slots of the whole job hold (the
        inverse of :meth:`slots_for`, rounded down)."""
        return max(0, slots - sum(self.gang_slots)) // self.role.resources.slots

    @cached_property
    def slot_range(self) -> Replicas:
        """How many slots the whole job holds: every fixed role's replicas plus the
        elastic role's range, each replica holding :attr:`Resources.slots` (a one-role
        job of one-slot replicas: that role's replicas). Kept: the controller's tick asks
        it of every queued job several times."""
        r = self.role.replicas
        return Replicas(
            min=self.slots_for(r.min), max=self.slots_for(r.max), initial=self.slots_for(r.initial)
        )

    def role_named(self, name: str) -> Role:
        """The role called ``name``; ``KeyError`` when the job has none."""
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)


def stops_alone(launcher: str, role: str, elastic: bool) -> bool:
    """Whether some replicas of a role can be stopped for good while its job goes on: an
    elastic role's, or a parameter-server job's workers (each leaves cleanly, the servers
    go on). The other replicas of a multi-role job count on each other (a server holds a
    shard, ``TF_CONFIG`` and hostfiles list every replica)."""
    return elastic or (launcher == Launcher.PS.value and role == WORKER_ROLE)


#: Kubeflow's default successPolicy: the first of these roles a job has ends it.
_LEAD_ROLES = ("chief", "master")


def _default_enders(names: list[str]) -> set[str]:
    """The roles that end a job whose spec marks none: the chief's (or master's) success,
    else every worker's (Kubeflow's default), else every role's (roles of other names)."""
    lead = next((n for n in _LEAD_ROLES if n in names), None)
    if lead is not None:
        return {lead}
    if WORKER_ROLE in names:
        return {WORKER_ROLE}
    return set(names)


def _role_from_spec(role: RoleSpec, spec: JobSpec, ends_job: bool) -> Role:
    replicas = role.replicas
    return Role(
        name=role.name,
        command=tuple(role.command),
        env={**spec.env, **role.env},
        working_dir=role.working_dir if role.working_dir is not None else spec.working_dir,
        resources=Resources(
            gpus=role.resources.gpus, cpus=role.resources.cpus, memory=role.resources.memory
        ),
        replicas=Replicas(
            min=replicas.min, max=replicas.max_workers, initial=replicas.initial_workers
        ),
        restart=RestartPolicy(
            max_restarts=(
                role.restart.max_restarts
                if role.restart.max_restarts is not None
                else spec.restart.max_restarts
            ),
            policy=RestartKind(role.restart.policy),
        ),
        launcher=Launcher(role.launcher),
        ends_job=ends_job,
    )


def _worker_from_spec(spec: JobSpec) -> Role:
    workers = spec.workers
    return Role(
        name=WORKER_ROLE,
        command=tuple(spec.command or ()),
        env=dict(spec.env),
        working_dir=spec.working_dir,
        resources=Resources(
            gpus=spec.resources.gpus, cpus=spec.resources.cpus, memory=spec.resources.memory
        ),
        replicas=Replicas(
            min=workers.min, max=workers.max_workers, initial=workers.initial_workers
        ),
        restart=RestartPolicy(max_restarts=spec.restart.max_restarts),
        launcher=Launcher(spec.launcher),
    )


def job_from_spec(
    spec: JobSpec, *, job_id: str = "", owner: str = DEFAULT_OWNER, team: str = DEFAULT_TEAM
) -> Job:
    """The job a validated spec describes: its ``roles``, or one ``worker`` role."""
    if spec.roles is None:
        roles: tuple[Role, ...] = (_worker_from_spec(spec),)
    else:
        if any(r.ends_job is not None for r in spec.roles):
            enders = {r.name for r in spec.roles if r.ends_job}
        else:
            enders = _default_enders([r.name for r in spec.roles])
        roles = tuple(_role_from_spec(r, spec, r.name in enders) for r in spec.roles)
    return Job(
        id=job_id,
        name=spec.name,
        owner=owner,
        team=team,
        roles=roles,
        priority=spec.priority,
        placement=Placement(group=spec.target.group, labels=dict(spec.target.labels)),
        checkpointing=Checkpointing(
            dir=spec.checkpoint_dir,
            every_steps=spec.checkpoint_every_steps,
            every_seconds=spec.checkpoint_every_seconds,
        ),
        labels=dict(spec.labels),
    )
