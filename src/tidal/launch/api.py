"""The launch layer's interface: what a backend hands the launch layer to run a job
(:class:`JobLaunch`, :class:`RoleLaunch`) and what it reports back (:class:`JobStatus`,
made of :class:`WorkerStatus` and the workers' :class:`MetricPoint` reports).

Plain data both sides share: it sits below both :mod:`tidal.launch` and
:mod:`tidal.backends` and imports neither (of tidal, only the policies' slot type).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tidal.launch.log_sink import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_MAX_BYTES
from tidal.policy.api import Slot

log = logging.getLogger(__name__)

__all__ = [
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
    #: Slots of a launch still in flight, before its workers are reported (the local
    #: backend's agent is starting): held all the same, so no other job is given them.
    starting_slots: tuple[Slot, ...] = ()

    def alive_slots(self) -> set[Slot]:
        """Slots whose worker still holds them, and those of a launch in flight."""
        return {s for w in self.workers if w.state.alive for s in w.held} | set(self.starting_slots)


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
    #: CPUs and bytes of memory each replica may use (``None``: not limited).
    cpus: float | None = None
    memory: int | None = None


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
    #: Each worker's log is rotated when it would pass this many bytes (0: never), keeping
    #: ``log_backups`` earlier files (``worker-K.log.1`` the newest; 0: it starts over).
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_backups: int = DEFAULT_LOG_BACKUPS
    checkpoint_dir: Path | None = None
    checkpoint_every_steps: int = 0
    checkpoint_every_seconds: float = 0.0
    #: Per-worker CPU and memory hints (bytes; ``None``: not limited); a backend may use
    #: them to size its limits.
    cpus: float | None = None
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
    #: The group's range of workers (``max_workers`` 0: not said, as in an earlier
    #: release's launch); the agent of an elastic group keeps warm interpreters.
    min_workers: int = 0
    max_workers: int = 0
    #: Every role of a multi-role job (or of a one-role job whose launcher is ``tf``,
    #: ``mpi`` or ``ps``); empty for a job run as one group (``argv`` ... ``role`` above).
    roles: tuple[RoleLaunch, ...] = ()
