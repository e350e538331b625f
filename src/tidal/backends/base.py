"""The backend interface: what the controller asks of whatever runs the workers.

A backend does what the controller says and reports what happened. It never replaces a
failed worker by itself and never moves a job between slots on its own: the controller
counts failures against the job's restart budget and asks again with :meth:`Backend.assign`.

A backend that knows the cluster better than the controller's own host (the nodes of a Ray
cluster) also implements :class:`HostDiscovery`: the controller then hands out exactly the
slots it reports, and follows hosts as they join and leave.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tidal.model import Launcher, RestartKind
from tidal.policy.api import Slot

log = logging.getLogger(__name__)

__all__ = [
    "LOCAL",
    "ONE_GROUP",
    "Backend",
    "Capabilities",
    "DiscoveredHost",
    "HostDiscovery",
    "JobLaunch",
    "JobStatus",
    "MetricPoint",
    "RoleLaunch",
    "WorkerState",
    "WorkerStatus",
    "read_reports",
    "worker_logs",
]


class WorkerState(str, Enum):
    """Where one worker process is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    #: Left on request (scale in, preemption, job stop): not a failure.
    RELEASED = "released"
    #: The user's program returned 0.
    EXITED = "exited"
    FAILED = "failed"

    @property
    def alive(self) -> bool:
        """Whether the worker still holds its slot."""
        return self in (WorkerState.STARTING, WorkerState.RUNNING)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as the backend sees it. ``worker_id`` is never reused within a job."""

    worker_id: int
    slot: Slot
    state: WorkerState
    pid: int | None = None
    exit_code: int | None = None
    #: The role it is a replica of and its index there (one-role jobs: ``worker``).
    role: str = "worker"
    index: int | None = None
    #: The exception that ended it (``ValueError: ...``), when it failed with a traceback.
    cause: str | None = None
    #: Every slot it holds, when more than one (a replica given several GPUs, all on
    #: ``slot``'s host); empty: ``slot`` alone.
    slots: tuple[Slot, ...] = ()

    @property
    def held(self) -> tuple[Slot, ...]:
        """Every slot the worker holds."""
        return self.slots or (self.slot,)


@dataclass(frozen=True)
class MetricPoint:
    """Training metrics one worker logged at one step (``tidal.log_metrics``)."""

    step: int
    time: float
    values: Mapping[str, float]


def read_reports(
    batches: Iterable[Mapping[str, Any]],
) -> tuple[tuple[MetricPoint, ...], dict[str, Any] | None]:
    """The metrics in the workers' report batches (:mod:`tidal.runtime.report`), oldest
    first, and the newest goodput report among them. A malformed entry is skipped: a
    report is never worth failing a job for."""
    metrics: list[MetricPoint] = []
    goodput: dict[str, Any] | None = None
    for batch in batches:
        try:
            for m in batch.get("metrics") or ():
                metrics.append(MetricPoint(int(m["step"]), float(m["time"]), dict(m["values"])))
            if batch.get("goodput"):
                goodput = dict(batch["goodput"])
        except (ValueError, KeyError, TypeError, AttributeError):
            log.debug("malformed report batch skipped")
    return tuple(metrics), goodput


@dataclass(frozen=True)
class JobStatus:
    """A job's workers as of the last poll."""

    job_id: str
    #: Membership generation the job's workers are in (bumped by every change).
    generation: int
    workers: tuple[WorkerStatus, ...] = ()
    #: Every worker finished its program successfully: the job is done.
    finished: bool = False
    #: The job cannot go on (e.g. no survivor and no checkpoint to resume from).
    failed: bool = False
    #: Why, when ``failed``.
    reason: str = ""
    #: Metrics the job's workers logged since the previous poll (each handed over once).
    metrics: tuple[MetricPoint, ...] = ()
    #: The job's newest goodput report, when one arrived since the previous poll: the
    #: fitted throughput model, noise scale, chosen batch, efficiency (JSON-like).
    goodput: Mapping[str, Any] | None = None

    def alive_slots(self) -> set[Slot]:
        """Slots whose worker still holds them."""
        return {s for w in self.workers if w.state.alive for s in w.held}


_WORKER_LOG = re.compile(r"^worker-(\d+)\.log$")


def worker_logs(log_dir: Path | None) -> dict[int, Path]:
    """Every worker log in ``log_dir`` (``worker-<K>.log``, see :attr:`JobLaunch.log_dir`)
    by worker number, lowest first (none if the folder is missing)."""
    if log_dir is None or not log_dir.is_dir():
        return {}
    found = [(int(m.group(1)), p) for p in log_dir.iterdir() if (m := _WORKER_LOG.match(p.name))]
    return dict(sorted(found))


@dataclass(frozen=True)
class RoleLaunch:
    """One role of a multi-role job, as its agent runs it (JSON-able: plain fields)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    launcher: str = "tidal"
    #: Replicas: fixed when ``min == max``; at most one role of a job is elastic.
    min: int = 1
    max: int = 1
    #: Kubeflow's restart policy: Never, OnFailure, Always or ExitCode.
    policy: str = "OnFailure"
    ends_job: bool = True
    #: Slots one replica holds, all on one host (its GPUs).
    replica_slots: int = 1


@dataclass(frozen=True)
class JobLaunch:
    """Everything a backend needs to run one job's workers; built by the controller."""

    job_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: Path | None = None
    #: Worker ``K`` writes its output to ``log_dir / f"worker-{K}.log"``: the controller
    #: reads logs from there once the backend has forgotten the job.
    log_dir: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every_steps: int = 0
    checkpoint_every_seconds: float = 0.0
    #: Per-worker CPU and memory hints (bytes); a backend may use them to size its limits.
    cpus: float = 1.0
    memory: int | None = None
    #: Whether slots are accelerators (the backend pins each worker to its GPU).
    gpu: bool = True
    #: What starts the workers (:class:`tidal.model.Launcher` value): ``tidal`` or
    #: ``torchrun`` (restart-based resize), and what a torchrun script is told of its role.
    launcher: str = "tidal"
    role: str = "worker"
    max_restarts: int = 3
    #: Slots one worker holds, all on one host (its GPUs): the slots a backend is given
    #: are this many to a worker.
    replica_slots: int = 1
    #: Every role of a multi-role job (or of a one-role job whose launcher is ``tf``,
    #: ``mpi`` or ``ps``); empty for a job run as one group (``argv`` ... ``role`` above).
    roles: tuple[RoleLaunch, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a backend runs."""

    launchers: frozenset[Launcher] = frozenset(Launcher)
    restart_policies: frozenset[RestartKind] = frozenset(RestartKind)
    #: Whether a job may have more than one role (and ``tf``/``mpi``/``ps`` roles).
    several_roles: bool = True
    #: The backend's name, for the messages.
    name: str = "this server"


#: The local and Ray backends: every launcher and restart policy, several roles.
LOCAL = Capabilities(name="the local backend")
#: A backend that runs a job as one group: ``tidal`` or ``torchrun``, one role.
ONE_GROUP = Capabilities(
    launchers=frozenset({Launcher.TIDAL, Launcher.TORCHRUN}),
    restart_policies=frozenset({RestartKind.ON_FAILURE, RestartKind.NEVER, RestartKind.EXIT_CODE}),
    several_roles=False,
)


class Backend(Protocol):
    """Runs workers on slots. Every method returns promptly; the work happens behind it.

    The controller loop makes every call but one from its own thread; :meth:`log_paths`
    is also called from the API's threads, so it must be safe to call concurrently.
    """

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Start the job with one worker per slot, or per ``launch.replica_slots`` slots of
        one host for workers of several GPUs (resuming from its checkpoint if any)."""
        ...

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Set a started job's slots, applied at its next step boundary.

        Workers on slots that stay keep running, workers on slots not listed leave, and a
        new worker starts on each listed slot that has no live worker (a new slot, or one
        whose worker failed). No slots is preemption: every worker leaves after a durable
        checkpoint and the job waits, known to the backend, for a later ``assign``.
        """
        ...

    def stop(self, job_id: str) -> None:
        """End the job for good (cancelled, failed, or finished): stop its workers and
        release whatever the backend holds for it."""
        ...

    def poll(self) -> Mapping[str, JobStatus]:
        """The status of every job started and not stopped, and of stopped jobs while any
        of their workers is still alive (their slots are not free yet). Reports the
        workers sent (metrics, goodput) are in the status of the poll that first sees
        them, and in no later one."""
        ...

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """Each worker's log file by worker id (workers that ever ran, newest last)."""
        ...

    def close(self) -> None:
        """Stop everything and release resources; the controller is shutting down."""
        ...


@dataclass(frozen=True)
class DiscoveredHost:
    """A host a backend found: its slots are ``(name, 0) .. (name, slots - 1)``."""

    name: str
    slots: int
    #: Whether the slots are accelerators.
    gpu: bool = False
    #: Resource group jobs may target (``target.group``), if the host declares one.
    group: str | None = None
    #: Node labels jobs may target (``target.labels``).
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The IP address its workers are reached at, if the backend knows it.
    address: str | None = None


@runtime_checkable
class HostDiscovery(Protocol):
    """Optional for a backend: the hosts it can run workers on, as they are now.

    The controller calls :meth:`hosts` at start and then every tick (from its loop's
    thread), so it must answer promptly (cache what is slow to learn). A host that joins
    adds slots the policy can hand out; a host that leaves takes its slots with it: its
    workers are reported failed through :meth:`Backend.poll` as usual, and the jobs are
    given slots elsewhere. A backend without this method runs on the hosts the
    controller was started with (``--slots`` or this machine's GPUs).
    """

    def hosts(self) -> Sequence[DiscoveredHost]:
        """Every host with at least one slot, in a stable order."""
        ...
