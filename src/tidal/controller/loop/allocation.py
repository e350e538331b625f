"""From jobs to an allocation: what the policy is asked, and whether its answer is valid.

:func:`policy_request` is the controller's side of the one request builder;
:func:`allocation_problems` checks a policy's answer against the cluster (both pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidal.controller.cluster import ClusterModel
from tidal.controller.store.jobs import JobRecord
from tidal.launch.slot_names import format_slot
from tidal.model import Job
from tidal.policy.api import JobRequest, Slot, ThroughputModel, job_request
from tidal.policy.whole_replicas import fit_replicas

__all__ = ["Placed", "allocation_problems", "plan_changes", "policy_request"]


def policy_request(
    record: JobRecord, job: Job, now: float, throughput: ThroughputModel | None = None
) -> JobRequest:
    """What the policy sees of ``record`` (whose model is ``job``) at ``now``.

    A job whose ``initial`` size is below its maximum (Arena's ``--workers N`` beside
    ``--min-workers``/``--max-workers``, a PyTorchJob's ``replicas``) is held there: that
    size is its target for good, not only where it starts, until ``tidal scale`` (or
    ``scale-out``/``scale-in``) sets another (see :func:`~tidal.policy.api.job_request`).
    Idle slots are not lent beyond a target: a job without one grows into them."""
    # Several roles: one request for the whole job (fixed roles plus the elastic range).
    replicas = job.slot_range
    return job_request(
        record.id,
        min_slots=replicas.min,
        max_slots=replicas.max,
        now=now,
        age_from=record.started_at,
        initial_slots=replicas.initial,
        target_slots=record.target_slots,
        priority=record.priority,
        submitted_at=record.submitted_at,
        group=job.placement.group,
        attained_service=record.attained_service,
        throughput=throughput,
        reallocations=record.reallocations,
        replica_slots=job.role.resources.slots,
        gang_slots=job.gang_slots,
        team=job.team,
        started_at=record.started_at,
    )


def allocation_problems(
    proposed: Mapping[str, Sequence[Slot]], jobs: Mapping[str, Job], cluster: ClusterModel
) -> list[str]:
    """What is wrong with a policy's answer for ``jobs`` (empty when nothing is)."""
    seen: set[Slot] = set()
    problems: list[str] = []
    for job_id, slots in proposed.items():
        job = jobs.get(job_id)
        if job is None:
            problems.append(f"unknown job {job_id}")
            continue
        if len(set(slots)) != len(slots) or seen & set(slots):
            problems.append(f"{job_id}: a slot given twice")
        seen |= set(slots)
        replicas = job.slot_range
        if slots and not replicas.min <= len(slots) <= replicas.max:
            problems.append(
                f"{job_id}: {len(slots)} slot(s) outside [{replicas.min}, {replicas.max}]"
            )
        if slots and not _whole(job, slots):
            problems.append(f"{job_id}: slots that do not make whole replicas on one host each")
        for host, index in slots:
            model = cluster.host(host)
            if model is None or not 0 <= index < model.slots:
                problems.append(f"{job_id}: no slot {format_slot((host, index))}")
            elif not model.matches(job.placement.group, job.placement.labels):
                problems.append(f"{job_id}: host {host} does not match the job's target")
    return problems


def _whole(job: Job, slots: Sequence[Slot]) -> bool:
    """Whether ``slots`` hold ``job``'s replicas whole, each on one host."""
    shape = JobRequest(
        job.id,
        min_slots=job.slot_range.min,
        max_slots=job.slot_range.max,
        replica_slots=job.role.resources.slots,
        gang_slots=job.gang_slots,
        team=job.team,
    )
    return shape.one_slot_replicas or fit_replicas(shape, slots, slots) == tuple(sorted(slots))


@dataclass(frozen=True)
class Placed:
    """A job whose slots change: to ``slots``, or it waits for ``busy`` slots to free."""

    job: JobRecord
    slots: tuple[Slot, ...]
    busy: tuple[Slot, ...] = ()


def plan_changes(
    jobs: Sequence[JobRecord],
    allocation: Mapping[str, Sequence[Slot]],
    occupied: Mapping[Slot, str],
    least: Mapping[str, int] | None = None,
) -> list[Placed]:
    """The jobs whose slots change, releasing ones first.

    A slot moves to its new job only once its old worker left: a job that would get a
    slot another job's worker still holds (``occupied``: slot → job) waits instead. Jobs
    that wait on each other (each holds a slot the other is to get) would wait for good,
    so each of them first gives up the slots the others wait for, where it can keep at
    least ``least[job]`` slots (default 1); the move completes on later rounds.
    """
    changes = [
        (j, tuple(sorted(allocation.get(j.id, ()))))
        for j in jobs
        if set(allocation.get(j.id, ())) != set(j.slots)
    ]
    changes.sort(key=lambda c: bool(set(c[1]) - set(c[0].slots)))
    placed: list[Placed] = []
    for job, slots in changes:
        busy = tuple(
            sorted(s for s in set(slots) - set(job.slots) if occupied.get(s, job.id) != job.id)
        )
        placed.append(Placed(job, slots, busy))
    return _release_for_waiting(placed, occupied, least or {})


def _release_for_waiting(
    placed: list[Placed], occupied: Mapping[Slot, str], least: Mapping[str, int]
) -> list[Placed]:
    """Turn a deadlocked wait into partial releases (see :func:`plan_changes`)."""
    waiting = {p.job.id: p for p in placed if p.busy}
    waits_on = {
        job_id: {occupied[s] for s in p.busy if occupied.get(s) in waiting}
        for job_id, p in waiting.items()
    }
    # Drop jobs that wait only on jobs whose own changes go ahead: they move next round.
    # What is left waits, directly or not, on a cycle and would never move.
    stuck = set(waits_on)
    while True:
        free = {j for j in stuck if not waits_on[j] & stuck}
        if not free:
            break
        stuck -= free
    if not stuck:
        return placed
    wanted = {s for j in stuck for s in waiting[j].busy}
    result: list[Placed] = []
    for change in placed:
        job = change.job
        keep = tuple(s for s in job.slots if s not in wanted)
        if job.id in stuck and len(keep) < len(job.slots) and len(keep) >= least.get(job.id, 1):
            result.append(Placed(job, tuple(sorted(keep))))
        else:
            result.append(change)
    return result
