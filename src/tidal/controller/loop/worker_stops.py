"""Whether some of a running job's workers can be stopped for good, as a pure function.

``stop_workers(ids)`` of the SDK (``POST /jobs/{job}/workers/stop``) names workers of a
job; the job goes on without them. What that means depends on the role they belong to:

* a fixed one-role job (``launch_workers(n)``) runs that many fewer from then on: its
  size is lowered, and it never replaces them;
* the workers of a parameter-server job (its ``worker`` role, fixed or not): each leaves
  cleanly, the servers go on with the others (its size is lowered the same way);
* an elastic job, or the elastic role of a multi-role job, is scaled in by as many (the
  scheduler may grow it again later, like any elastic job);
* any other replica of a multi-role job (a parameter server, a chief, a ``tf`` or ``mpi``
  replica) cannot be stopped alone: the other replicas count on it.

Either way the job gives up exactly those workers' slots at its next allocation
(:mod:`tidal.controller.store.requests`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.controller.loop.launching import runs_as_one_group
from tidal.controller.store.records import JobRecord, WorkerRecord
from tidal.controller.store.requests import StopWorkers
from tidal.launch.api import WorkerState
from tidal.model import Job, Role, stops_alone
from tidal.ps.env import ENV_MODE, ENV_REPLICAS_TO_AGGREGATE

__all__ = ["StopRefused", "plan_stop"]

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
        if worker.slot not in gone:  # else already stopped, still leaving
            named[worker_id] = worker
    roles = sorted({w.role for w in named.values()})
    if len(roles) > 1:
        return StopRefused("workers", f"name workers of one role at a time (got {roles})", 422)
    one_group = runs_as_one_group(model)
    if one_group:
        role, kind = model.role, ("elastic" if model.role.replicas.elastic else "fixed")
    else:
        found = _stoppable(model, job, named, ids)
        if isinstance(found, StopRefused):
            return found
        role, kind = found
    staying = [
        w
        for w in live.values()
        if w.slot not in gone and w.worker_id not in named and (one_group or w.role == role.name)
    ]
    if named and not staying:
        whole = "every running worker" if one_group else f"every running {role.name} replica"
        return StopRefused("workers", f"that is {whole} of job {job.id}: cancel the job instead")
    if kind == "elastic" and named:
        held = len(job.slots) - len(gone & set(job.slots))
        # Counted in slots: a worker holds as many as its replica's GPUs.
        left = held - sum(len(w.held) for w in named.values())
        if left < job.min_slots:
            unit = "" if role.resources.slots == 1 else " slot(s)"
            return StopRefused(
                "workers",
                f"stopping {len(named)} worker(s) would leave job {job.id} {left}{unit}, "
                f"below its minimum of {job.min_slots}",
            )
    if kind == "fixed" and named and not one_group:
        problem = _aggregation_problem(role, len(staying))
        if problem is not None:
            return StopRefused("workers", problem)
    ordered = sorted(named)
    return StopWorkers(
        worker_ids=tuple(ordered),
        slots=tuple(s for w in ordered for s in named[w].held),
        role=role.name,
        fixed=kind == "fixed",
    )


def _stoppable(
    model: Job, job: JobRecord, named: dict[int, WorkerRecord], ids: Sequence[int]
) -> tuple[Role, str] | StopRefused:
    """The role of a multi-role job's named workers and how it gives them up (``elastic``:
    its target drops; ``fixed``: its size does), or why it cannot."""
    for i, worker_id in enumerate(ids):
        worker = named.get(worker_id)
        if worker is None:
            continue
        try:
            role = model.role_named(worker.role)
        except KeyError:
            return StopRefused(
                f"workers[{i}]", f"worker {worker_id} has no role of job {job.id} ({worker.role})"
            )
        if role.replicas.elastic:
            return role, "elastic"
        if stops_alone(role.launcher.value, role.name, elastic=False):
            return role, "fixed"
        return StopRefused(
            f"workers[{i}]",
            f"worker {worker_id} is a replica of role {role.name} of job {job.id}, which the "
            "job's other replicas count on: only an elastic role's replicas or a "
            "parameter-server job's workers can be stopped alone (or cancel the job)",
        )
    return model.role, "elastic" if model.role.replicas.elastic else "fixed"


def _aggregation_problem(role: Role, left: int) -> str | None:
    """Why a sync parameter-server job cannot go on with ``left`` workers: the servers
    wait for a fixed ``replicas_to_aggregate`` gradients a step."""
    env = role.env
    fixed = env.get(ENV_REPLICAS_TO_AGGREGATE)
    if env.get(ENV_MODE) != "sync" or fixed is None:
        return None
    try:
        wanted = int(fixed)
    except ValueError:
        return None
    if left >= wanted:
        return None
    return (
        f"stopping them would leave {left} worker(s) of a sync job whose servers wait for "
        f"replicas_to_aggregate={wanted} gradients a step"
    )
