"""A job's status the way Kubeflow shows it: replicas per role and a list of conditions.

Both are pure readings of what the store keeps: :func:`role_statuses` of the job's model
and its workers, :func:`conditions` of its record and events. The API puts them in a
job's detail; ``tidal get`` prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.controller.store.records import EventRecord, JobRecord, WorkerRecord
from tidal.launch.api import WorkerState
from tidal.model import Job
from tidal.model_states import JobState

__all__ = ["Condition", "RoleStatus", "conditions", "role_statuses"]

_ACTIVE = (WorkerState.STARTING, WorkerState.RUNNING)


@dataclass(frozen=True)
class RoleStatus:
    """One role's replicas: how many it should have now, and how many are active, have
    succeeded (exited 0) or failed (each failure is a restart while the job goes on)."""

    name: str
    replicas: int
    active: int
    succeeded: int
    failed: int


@dataclass(frozen=True)
class Condition:
    """One Kubeflow-style condition; ``status`` is ``"True"`` for the one the job is in
    now (and for ``Created``), ``"False"`` for those it has left."""

    type: str
    status: str
    reason: str
    message: str
    time: float


def role_statuses(job: Job, record: JobRecord, workers: Sequence[WorkerRecord]) -> list[RoleStatus]:
    """Each role of ``job``, in the spec's order, from its workers' last known states."""
    fixed = sum(r.replicas.max for r in job.roles if r.replicas.min == r.replicas.max)
    statuses: list[RoleStatus] = []
    for role in job.roles:
        mine = [w for w in workers if w.role == role.name]
        if role.replicas.min == role.replicas.max:
            wanted = role.replicas.max
        elif record.slots:
            wanted = max(len(record.slots) - fixed, 0)
        else:
            wanted = role.replicas.initial
        statuses.append(
            RoleStatus(
                name=role.name,
                replicas=wanted,
                active=sum(w.state in _ACTIVE for w in mine),
                succeeded=sum(w.state is WorkerState.EXITED and w.exit_code == 0 for w in mine),
                failed=sum(w.state is WorkerState.FAILED for w in mine),
            )
        )
    return statuses


#: Event kinds and the condition each moves the job into, with Kubeflow's reason.
_TRANSITIONS = {
    "submitted": ("Created", "JobCreated"),
    "started": ("Running", "JobRunning"),
    "resumed": ("Running", "JobRunning"),
    "rescaled": ("Running", "JobRunning"),
    "worker_failed": ("Restarting", "JobRestarting"),
    "preempted": ("Suspended", "JobSuspended"),
    "lost": ("Restarting", "JobRestarting"),
    "succeeded": ("Succeeded", "JobSucceeded"),
    "failed": ("Failed", "JobFailed"),
    "cancelled": ("Failed", "JobCancelled"),
}


def conditions(record: JobRecord, events: Sequence[EventRecord]) -> list[Condition]:
    """The conditions the job went through, each once with its latest transition, in the
    order first entered; the one it is in now is ``"True"``."""
    latest: dict[str, Condition] = {
        "Created": Condition("Created", "True", "JobCreated", "", record.submitted_at)
    }
    order = ["Created"]
    current = "Created"
    for event in sorted(events, key=lambda e: (e.time, e.id)):
        found = _TRANSITIONS.get(event.kind)
        if found is None:
            continue
        kind, reason = found
        # A rescale settling matters only when it ends a restart or a suspension.
        if event.kind == "rescaled" and current == "Running":
            continue
        if kind != "Created":
            current = kind
        if kind not in order:
            order.append(kind)
        latest[kind] = Condition(kind, "False", reason, event.message, event.time)
    if record.state is JobState.QUEUED and current not in ("Created", "Suspended"):
        current = "Created"  # requeued after a loss: waiting for slots again
    return [
        Condition(
            c.type,
            "True" if c.type in (current, "Created") else "False",
            c.reason,
            c.message,
            c.time,
        )
        for c in (latest[kind] for kind in order)
    ]
