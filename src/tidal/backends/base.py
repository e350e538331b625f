"""The backend interface: what the controller asks of whatever runs the workers.

A backend does what the controller says and reports what happened. It never replaces a
failed worker by itself and never moves a job between slots on its own: the controller
counts failures against the job's restart budget and asks again with :meth:`Backend.assign`.

A backend that knows the cluster better than the controller's own host (the nodes of a Ray
cluster) also implements :class:`HostDiscovery`: the controller then hands out exactly the
slots it reports, and follows hosts as they join and leave.

What passes through the interface (:class:`~tidal.launch.api.JobLaunch`,
:class:`~tidal.launch.api.JobStatus`) is the launch layer's own types, which every
backend hands on to :mod:`tidal.launch`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tidal.launch import api as launch_api
from tidal.launch.api import JobLaunch, JobStatus
from tidal.model import Launcher, RestartKind
from tidal.policy.api import Slot
from tidal.policy.autoscale import SlotBundle

__all__ = [
    "LOCAL",
    "ONE_GROUP",
    "Backend",
    "Capabilities",
    "ClusterScaling",
    "DiscoveredHost",
    "DrainNotices",
    "HostDiscovery",
]


@dataclass(frozen=True)
class Capabilities:
    """What a backend runs."""

    launchers: frozenset[Launcher] = frozenset(Launcher)
    restart_policies: frozenset[RestartKind] = frozenset(RestartKind)
    #: Whether a job may have more than one role (and ``tf``/``mpi``/``ps`` roles).
    several_roles: bool = True
    #: The backend's name, for the messages.
    name: str = "this server"
    #: Its workers run on the server's host and see its files, so a spec's working dir
    #: and script can be checked when it is submitted. A backend whose workers run on
    #: other machines (Ray's nodes) says no: a path missing here may exist there.
    shared_files: bool = False


#: The local and Ray backends: every launcher and restart policy, several roles (the
#: local backend adds ``shared_files``).
LOCAL = Capabilities(name="the local backend")
#: A backend that runs a job as one group: ``tidal`` or ``torchrun``, one role.
ONE_GROUP = Capabilities(
    launchers=frozenset(launcher for launcher in Launcher if launcher.forms_group),
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
        one host for workers of several GPUs (resuming from its checkpoint if any).
        Returns without waiting for the workers (the loop's requests wait for it);
        ``assign`` and ``stop`` may follow at once and are carried out once it is up."""
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
        of their workers is still alive (their slots are not free yet). A job whose start
        is still under way (``start`` returned before its workers could be reported)
        names the slots it holds in ``starting_slots``. Reports the workers sent (metrics,
        goodput) are in the status of the poll that first sees them, and in no later one."""
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
    #: CPUs and bytes of memory the host offers its workers (``None``: not known).
    cpus: float | None = None
    memory: int | None = None


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


@runtime_checkable
class DrainNotices(Protocol):
    """Optional for a backend: the hosts its platform says are about to leave (Ray's
    node drain, a cloud's preemption notice it learns of), each with the time it goes
    (seconds since the epoch; ``None``: not known). The controller drains each one
    (:mod:`tidal.policy.drain`); called every tick from the loop's thread, so it must
    answer promptly (cache what is slow to learn)."""

    def leaving(self) -> Mapping[str, float | None]:
        """Every host being drained by the platform, with the time it goes."""
        ...


@runtime_checkable
class ClusterScaling(Protocol):
    """Optional for a backend whose cluster grows and shrinks on request (Ray's
    autoscaler): ``tidal server --autoscale`` tells it how many slots the jobs would use.

    The controller calls :meth:`request_slots` from its loop's thread when the number
    changes. The nodes that the request brings are found through :class:`HostDiscovery`
    like any other, and the cluster gives back the ones left idle by its own rules.
    """

    def request_slots(self, slots: int) -> None:
        """Ask for a cluster of at least ``slots`` slots in all, replacing the previous
        request (0 withdraws it)."""
        ...


@runtime_checkable
class BundleScaling(Protocol):
    """Optional beside :class:`ClusterScaling`: a cluster asked for room by shape, one
    bundle per replica (``slots`` slots of one host carrying ``labels``). The controller
    calls :meth:`request_bundles` instead of ``request_slots`` when the backend has it."""

    def request_bundles(self, bundles: Sequence[SlotBundle]) -> None:
        """Ask for room for every bundle at once, replacing the previous request (an
        empty one withdraws it)."""
        ...


#: Names that moved to :mod:`tidal.launch.api` (the launch layer's types, below the
#: backends). A backend plugin (``tidal server --backend module:Class``) importing them
#: from here keeps working for one release, warned.
_MOVED = frozenset(
    {
        "JobLaunch",
        "JobStatus",
        "MetricPoint",
        "RoleLaunch",
        "WorkerState",
        "WorkerStatus",
        "read_reports",
        "worker_logs",
    }
)


def __getattr__(name: str) -> Any:
    """A moved name, from :mod:`tidal.launch.api`, with a :class:`DeprecationWarning`."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"tidal.backends.base.{name} is deprecated: import it from tidal.launch.api",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(launch_api, name)
