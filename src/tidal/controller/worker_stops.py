"""Whether some of a running job's workers can be stopped for good, as a pure function.

``stop_workers(ids)`` of the SDK (``POST /jobs/{job}/workers/stop``) names workers of a
job; the job goes on without them. What that means depends on the job:

* a one-role job of a fixed size (``launch_workers(n)``) runs that many fewer from then
  on: its size is lowered, and it never replaces them;
* an elastic job (or the elastic role of a multi-role job) is scaled in by as many, and
  gives up exactly those workers' slots (the scheduler may grow it again later, like any
  elastic job);
* a replica of a fixed role of a multi-role job (a parameter server, a chief) cannot be
  stopped alone: the other roles count on it.

The request names the workers' slots: the controller gives exactly those up at the job's
next allocation (:mod:`tidal.controller.requests`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.backends.base import WorkerState
from tidal.controller.records import JobRecord, WorkerRecord
from tidal.controller.requests import StopWorkers
from tidal.model import Job, Launcher

__all__ = ["StopRefused", "plan_stop"]

#: Launchers whose roles run as replica sets, which hold a fixed role's size.
_REPLICA_LAUNCHERS = frozenset({Launcher.TF, Launcher.MPI, Launcher.PS})
_LIVE = frozenset({WorkerState.STARTING, WorkerState.RUNNING})


@dataclass(frozen=True)
class StopRefused:
    """Why the workers cannot be stopped: the argument at fault and an HTTP status (409:
    not now or not for this job; 422: the ids themselves)."""

    field: str
    message: str
    status: int = 409


def plan_stop(
    job: JobRecord, model: Job, workers: Sequence[WorkerRecord], ids: Sequence[int]
) -> StopWorkers | StopRefused:
    """The request that stops workers ``ids`` of ``job`` (whose model is ``model`` and
    whose workers are ``workers``), or why it cannot be made."""
    if not ids:
        return StopRefused("workers", "name at least one worker", 422)
    if not job.state.holds_slots:
        return StopRefused(
            "workers",
            f"job {job.id} is {job.state.value}: its workers can be stopped once they run "
            "(or cancel the job)",
        )
    live = {w.worker_id: w for w in workers if w.state in _LIVE}
    gone = set(job.release_slots)
    named: dict[int, WorkerRecord] = {}
    for i, worker_id in enumerate(ids):
        worker = live.get(worker_id)
        if worker is None:
            known = next((w for w in workers if w.worker_id == worker_id), None)
            state = "not started" if known is None else known.state.value
            return StopRefused(
                f"workers[{i}]", f"worker {worker_id} of job {job.id} is {state}, not running"
            )
        if worker.slot in gone:
            continue  # already stopped, still leaving
        named[worker_id] = worker
    staying = [w for w in live.values() if w.slot not in gone and w.worker_id not in named]
    if named and not staying:
        return StopRefused(
            "workers",
            f"that is every running worker of job {job.id}: cancel the job to stop them all",
        )
    one_group = len(model.roles) == 1 and model.role.launcher not in _REPLICA_LAUNCHERS
    scaling = model.role
    if not one_group:
        for i, worker_id in enumerate(ids):
            worker = named.get(worker_id)
            if worker is None:
                continue
            if not scaling.replicas.elastic or worker.role != scaling.name:
                return StopRefused(
                    f"workers[{i}]",
                    f"worker {worker_id} is a replica of role {worker.role} of job {job.id}, "
                    "which has a fixed size: only the elastic role's replicas can be stopped "
                    "alone (or cancel the job)",
                )
    fixed = one_group and not scaling.replicas.elastic
    if not fixed and named:
        held = len(job.slots) - len(gone & set(job.slots))
        if held - len(named) < job.min_workers:
            return StopRefused(
                "workers",
                f"stopping {len(named)} worker(s) would leave job {job.id} {held - len(named)}, "
                f"below its minimum of {job.min_workers}",
            )
    ordered = sorted(named)
    return StopWorkers(
        worker_ids=tuple(ordered),
        slots=tuple(named[w].slot for w in ordered),
        fixed=fixed,
    )
