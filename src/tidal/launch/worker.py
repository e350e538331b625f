"""One worker of a group: what it runs, where it is in the rescale protocol, its
environment and its log file.

A worker is named ``w<K>`` inside its group and reported as worker ``K`` to the
controller; ``K`` is never reused within a group. Its output goes to
``<log_dir>/worker-<K>.log`` (:func:`worker_log_path`), which the controller reads
(:func:`tidal.launch.api.worker_logs`) even after the backend forgot the job.

What the workers run is a :class:`WorkerSpec`; every backend builds it from the
controller's :class:`~tidal.launch.api.JobLaunch` with :func:`worker_spec` (and a
multi-role job's roles theirs with :func:`role_spec`), so the launch's fields are
copied in one place.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tidal.launch.api import JobLaunch, RoleLaunch
from tidal.launch.failure_cause import failure_cause
from tidal.launch.limits import ENV_CPUS, ENV_MEMORY, WorkerLimits
from tidal.launch.log_sink import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_MAX_BYTES, RotatingLog
from tidal.launch.process import Spawner, WorkerProcess
from tidal.launch.slot_names import slot_indices
from tidal.runtime.env import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_SECONDS,
    ENV_CHECKPOINT_EVERY_STEPS,
    ENV_RUN_ID,
    ENV_SLOT,
    ENV_STORE,
    ENV_SYNC_EVERY,
    ENV_TIMEOUT,
    ENV_WORKER_ID,
)

__all__ = [
    "ENV_ENGINE_ID",
    "ENV_IP_ADDRESS",
    "ENV_PEER_ADDRESSES",
    "Worker",
    "WorkerIds",
    "WorkerPhase",
    "WorkerSpec",
    "close_outputs",
    "kill_workers",
    "role_spec",
    "spawn_logged",
    "wait_for_exit",
    "worker_env",
    "worker_log_path",
    "worker_number",
    "worker_spec",
]


class WorkerPhase(enum.Enum):
    """Where a worker process is in the rescale protocol (inside its group; a backend
    reports the coarser :class:`~tidal.launch.api.WorkerState`)."""

    STARTING = "starting"  # process started, model not built yet
    READY = "ready"  # waiting to be admitted
    MEMBER = "member"  # in the current generation
    LEAVING = "leaving"  # released, finishing its step
    EXITED = "exited"


@dataclass
class WorkerSpec:
    """What every worker of the job runs, and how (fields named as in
    :class:`~tidal.launch.api.JobLaunch` where they mean the same)."""

    argv: list[str]
    #: The job (``tidal run``: the run) the workers belong to (``TIDAL_RUN_ID``).
    job_id: str
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    log_dir: Path | None = None
    #: Each worker's log is capped at this many bytes, then rotated (0: never) …
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    #: … into this many earlier files.
    log_backups: int = DEFAULT_LOG_BACKUPS
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    checkpoint_every_seconds: float = 0.0
    #: Bound on collectives and joins inside the workers, in seconds.
    timeout: float = 10.0
    sync_every: int = 1
    #: Slots are GPUs: a worker on slot ``host:i`` sees only GPU ``i`` (on ``host:i,j``,
    #: GPUs ``i`` and ``j``).
    gpu: bool = False
    #: Slots one worker holds, all on one host (its GPUs).
    replica_slots: int = 1
    #: What starts the workers and forms their group: ``tidal`` (the rescale protocol, in
    #: place) or ``torchrun`` (torchrun's environment; every resize restarts the group).
    launcher: str = "tidal"
    #: The role's name (torchrun's ``ROLE_NAME``).
    role: str = "default"
    #: Failures the job survives (torchrun's ``TORCHELASTIC_MAX_RESTARTS``).
    max_restarts: int = 3
    #: Seconds a torchrun-launched worker gets between SIGTERM and SIGKILL when its group
    #: restarts.
    stop_grace: float = 30.0
    #: CPUs and bytes of memory each worker may use (``None``: no limit); they reach the
    #: worker in ``env`` (:mod:`tidal.launch.limits`), where the spawner enforces them.
    cpus: float | None = None
    memory: int | None = None


def worker_spec(launch: JobLaunch, *, timeout: float, pin_gpus: bool = True) -> WorkerSpec:
    """What every worker of ``launch``'s job runs: its fields, under the same names.

    ``timeout`` bounds collectives and joins inside the workers; ``pin_gpus``: whether
    a worker is pinned to its slots' GPUs here (``CUDA_VISIBLE_DEVICES``), when the
    launch's slots are GPUs (``False``: the backend gives each worker its GPUs itself).
    """
    limits = WorkerLimits(cpus=launch.cpus, memory=launch.memory)
    return WorkerSpec(
        argv=list(launch.argv),
        job_id=launch.job_id,
        env={**launch.env, **limits.env()},
        working_dir=str(launch.working_dir) if launch.working_dir else None,
        log_dir=launch.log_dir,
        log_max_bytes=launch.log_max_bytes,
        log_backups=launch.log_backups,
        checkpoint_dir=str(launch.checkpoint_dir) if launch.checkpoint_dir else None,
        checkpoint_every_steps=launch.checkpoint_every_steps,
        checkpoint_every_seconds=launch.checkpoint_every_seconds,
        timeout=timeout,
        gpu=launch.gpu and pin_gpus,
        replica_slots=launch.replica_slots,
        launcher=launch.launcher,
        role=launch.role,
        max_restarts=launch.max_restarts,
        cpus=launch.cpus,
        memory=launch.memory,
    )


def role_spec(
    spec: WorkerSpec, role: RoleLaunch, env: Mapping[str, str] | None = None
) -> WorkerSpec:
    """What the replicas of ``role`` of a multi-role job run: the job's ``spec`` (its id,
    logs, checkpoints) with the role's command, environment (over the job's, then
    ``env``), working dir, launcher and limits."""
    limits = WorkerLimits(cpus=role.cpus, memory=role.memory)
    inherited = {k: v for k, v in spec.env.items() if k not in (ENV_CPUS, ENV_MEMORY)}
    return replace(
        spec,
        argv=list(role.argv),
        env={**inherited, **role.env, **limits.env(), **(env or {})},
        working_dir=role.working_dir or spec.working_dir,
        launcher=role.launcher,
        role=role.name,
        cpus=role.cpus,
        memory=role.memory,
    )


@dataclass
class Worker:
    """One worker process."""

    id: str
    slot: str
    process: WorkerProcess
    phase: WorkerPhase = WorkerPhase.STARTING
    exit_code: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    #: Formed a generation at least once: it holds (or held) the training state.
    trained: bool = False
    #: Killed by the group itself (never admitted, or left behind by a finished job).
    killed: bool = False
    #: Exited without being asked to: its slot waits to be assigned again.
    failed: bool = False
    #: Exited while it was leaving: whatever its status, it was on its way out (a peer's
    #: crash in the handover can end it with an error), so it did not fail.
    left: bool = False
    #: The role it is a replica of, and its index there (a multi-role job's groups set
    #: them; a one-role job's workers are all ``worker``).
    role: str = "worker"
    index: int | None = None
    #: The exception that ended it, when it failed with a Python traceback.
    cause: str | None = None

    def failed_with(self, message: str, log_dir: Path | None, memory: int | None = None) -> str:
        """Record why this worker failed (:func:`failure_cause`; with a ``memory`` limit,
        that it passed it) and return ``message`` followed by it."""
        log_path = worker_log_path(log_dir, self.id) if log_dir is not None else None
        self.cause = failure_cause(self.process, log_path, memory)
        return message if self.cause is None else f"{message}: {self.cause}"


class WorkerIds:
    """Worker names ``w<K>`` from one counter: never reused within a job, also across
    the groups of a multi-role job."""

    def __init__(self, first: int = 0) -> None:
        """Start at ``w<first>``."""
        self.next = first

    def take(self) -> str:
        """The next unused name."""
        name = f"w{self.next}"
        self.next += 1
        return name


def worker_number(worker_id: str) -> int:
    """``w<K>`` → ``K``, the worker id a backend reports."""
    return int(worker_id.lstrip("w"))


#: Where a worker is reached and who its peers are, under Cloudera ML's names (a worker
#: launched from a notebook finds the notebook through ``CDSW_MASTER_IP``, which the
#: launching client sets) and tidal's.
ENV_ENGINE_ID = "CDSW_ENGINE_ID"
ENV_IP_ADDRESS = "CDSW_IP_ADDRESS"
ENV_PEER_ADDRESSES = "TIDAL_PEER_ADDRESSES"


def worker_env(
    spec: WorkerSpec,
    *,
    worker_id: str,
    slot: str,
    store: str,
    peers: Sequence[str] = (),
) -> dict[str, str]:
    """What a worker needs on top of the environment where it runs: the job's own
    variables, the runtime's ``TIDAL_*`` ones (the spawner adds that environment), its id
    as ``await_workers`` names it (``CDSW_ENGINE_ID``, ``<job>/<number>``), its host's
    address (``CDSW_IP_ADDRESS``: where the job's store listens, on the worker's machine)
    and the addresses of the group's slots (``peers``, comma-separated in
    ``TIDAL_PEER_ADDRESSES``, one per worker, in slot order)."""
    address = store.rsplit(":", 1)[0]
    env = dict(spec.env)
    env.update(
        {
            ENV_ENGINE_ID: f"{spec.job_id}/{worker_number(worker_id)}",
            ENV_IP_ADDRESS: address,
            ENV_PEER_ADDRESSES: ",".join(peers),
            ENV_STORE: store,
            ENV_WORKER_ID: worker_id,
            ENV_RUN_ID: spec.job_id,
            ENV_SLOT: slot,
            ENV_TIMEOUT: str(spec.timeout),
            ENV_SYNC_EVERY: str(spec.sync_every),
            ENV_CHECKPOINT_EVERY_STEPS: str(spec.checkpoint_every_steps),
            ENV_CHECKPOINT_EVERY_SECONDS: str(spec.checkpoint_every_seconds),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if spec.checkpoint_dir:
        env[ENV_CHECKPOINT_DIR] = spec.checkpoint_dir
    if spec.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot_indices(slot))
    return env


def worker_log_path(log_dir: Path, worker_id: str) -> Path:
    """The log file of worker ``w<K>``: ``log_dir / "worker-<K>.log"``."""
    return log_dir / f"worker-{worker_number(worker_id)}.log"


def spawn_logged(
    spawner: Spawner,
    spec: WorkerSpec,
    *,
    worker_id: str,
    slot: str,
    env: Mapping[str, str],
    on_output: Callable[[str, str], None] | None,
    files: list[RotatingLog],
) -> WorkerProcess:
    """Start ``worker_id``'s process of ``spec`` on ``slot`` with ``spawner``, its output
    going to its log file in ``spec.log_dir`` (capped and rotated as ``spec`` says; opened
    here and appended to ``files``, which the caller closes) and to
    ``on_output(worker_id, line)``."""
    sink: RotatingLog | None = None
    if spec.log_dir is not None:
        path = worker_log_path(spec.log_dir, worker_id)
        sink = RotatingLog(path, max_bytes=spec.log_max_bytes, backups=spec.log_backups)
        files.append(sink)

    def on_line(line: str) -> None:
        if sink is not None:
            sink.write(line)
        if on_output is not None:
            on_output(worker_id, line.rstrip("\n"))

    return spawner.spawn(
        worker_id=worker_id,
        slot=slot,
        argv=spec.argv,
        env=env,
        cwd=spec.working_dir,
        on_line=on_line,
    )


def wait_for_exit(workers: Sequence[Worker], grace: float) -> None:
    """Wait up to ``grace`` seconds for every one of ``workers`` to exit."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(w.process.poll() is None for w in workers):
        time.sleep(0.02)


def kill_workers(workers: Iterable[Worker]) -> None:
    """SIGKILL every worker's process group and reap it; each is then ``EXITED``.

    One still running is marked ``killed`` (its exit is the group's doing, not a failure).
    One that exited already is killed too: what it started in its own session may
    outlive it.
    """
    for worker in workers:
        if worker.process.poll() is None:
            worker.killed = True
        worker.process.kill()
        worker.process.wait(timeout=10)
        if worker.exit_code is None:
            worker.exit_code = worker.process.returncode
        worker.phase = WorkerPhase.EXITED


def close_outputs(workers: Iterable[Worker], log_files: list[RotatingLog]) -> None:
    """Read what the workers' pipes still hold, then close their log files."""
    for worker in workers:
        worker.process.drain(timeout=5)
    for sink in log_files:
        sink.close()
    log_files.clear()
