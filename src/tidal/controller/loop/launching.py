"""Where a job's files live on the server, and the launch a backend is given to start it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from tidal.backends.base import Backend
from tidal.launch.api import JobLaunch, RoleLaunch, worker_logs
from tidal.launch.log_sink import DEFAULT_LOG_BACKUPS, DEFAULT_LOG_MAX_BYTES
from tidal.model import Job, Role

__all__ = ["JobFiles", "build_launch", "role_launches", "runs_as_one_group"]

log = logging.getLogger(__name__)


class JobFiles:
    """The directories of jobs under the server's data dir: ``jobs/<id>/{logs,checkpoints}``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
        log_backups: int = DEFAULT_LOG_BACKUPS,
    ) -> None:
        """``log_max_bytes``, ``log_backups``: how each worker's log is capped and rotated
        (:class:`~tidal.launch.api.JobLaunch`'s fields of those names)."""
        self.data_dir = data_dir
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups

    def job_dir(self, job_id: str) -> Path:
        """Where the job's logs (and, by default, checkpoints) live."""
        return self.data_dir / "jobs" / job_id

    def log_dir(self, job_id: str) -> Path:
        """Where the job's workers write their logs."""
        return self.job_dir(job_id) / "logs"

    def log_paths(self, job_id: str, backend: Backend) -> dict[int, Path]:
        """Each worker's log by worker id: what the backend reports, and the files left in
        the job's log dir (so logs stay readable after the backend forgot the job)."""
        found = worker_logs(self.log_dir(job_id))
        reported: Mapping[int, Path] = {}
        try:
            reported = backend.log_paths(job_id)
        except Exception:
            log.exception("backend log_paths failed for %s", job_id)
        found.update(reported)
        return found


def _role_launch(role: Role, job_id: str) -> RoleLaunch:
    return RoleLaunch(
        name=role.name,
        argv=role.command,
        env={**role.env, "TIDAL_JOB_ID": job_id},
        working_dir=role.working_dir,
        launcher=role.launcher.value,
        min=role.replicas.min,
        max=role.replicas.max,
        policy=role.restart.policy.value,
        ends_job=role.ends_job,
        replica_slots=role.resources.slots,
        cpus=role.resources.cpus,
        memory=role.resources.memory,
    )


def runs_as_one_group(job: Job) -> bool:
    """Whether the job's workers are one group (one role, launched by ``tidal`` or
    ``torchrun``) rather than roles the backend runs one by one."""
    return len(job.roles) == 1 and not job.role.launcher.runs_replicas


def role_launches(job: Job) -> tuple[RoleLaunch, ...]:
    """The roles the backend runs one by one: every role of a multi-role job, or the one
    role of a job whose launcher is ``tf``, ``mpi`` or ``ps``; empty for one group."""
    if runs_as_one_group(job):
        return ()
    return tuple(_role_launch(r, job.id) for r in job.roles)


def build_launch(job: Job, files: JobFiles, *, gpu: bool) -> JobLaunch:
    """What the backend needs to start ``job``'s workers; ``gpu``: the cluster's slots are
    accelerators."""
    role = job.role
    working_dir = Path(role.working_dir) if role.working_dir else None
    checkpoint_dir = files.job_dir(job.id) / "checkpoints"
    if job.checkpointing.dir:
        # Relative to the job's working directory, like the paths in its command.
        checkpoint_dir = (working_dir or Path()) / job.checkpointing.dir
    return JobLaunch(
        job_id=job.id,
        argv=role.command,
        env={**role.env, "TIDAL_JOB_ID": job.id},
        working_dir=working_dir,
        log_dir=files.log_dir(job.id),
        log_max_bytes=files.log_max_bytes,
        log_backups=files.log_backups,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_steps=job.checkpointing.every_steps,
        checkpoint_every_seconds=job.checkpointing.every_seconds,
        cpus=role.resources.cpus,
        memory=role.resources.memory,
        gpu=gpu and role.resources.gpus > 0,
        launcher=role.launcher.value,
        role=role.name,
        max_restarts=role.restart.max_restarts,
        roles=role_launches(job),
        replica_slots=role.resources.slots,
        min_workers=role.replicas.min if runs_as_one_group(job) else 0,
        max_workers=role.replicas.max if runs_as_one_group(job) else 0,
    )
