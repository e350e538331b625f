"""New jobs entering the store: their ids, their rows and their ``submitted`` events.

Submissions arrive many at a time (:mod:`.group_commit` gathers them); each batch is
written with one insert per table and one change number per job, which is what keeps
a burst of submissions cheap. :class:`~tidal.controller.store.jobs.JobStore` runs
:func:`insert_jobs` in its transaction.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from tidal.controller.store.database import number_changes
from tidal.controller.store.records import JobRecord
from tidal.controller.store.registry import ModelRun, insert_runs
from tidal.controller.store.tables import EventRow, JobRow
from tidal.model import Job
from tidal.model_states import JobState
from tidal.spec import JobSpec

__all__ = ["Addition", "insert_jobs", "new_ids"]


class Addition(NamedTuple):
    """A job to add: its spec, when, whose, and through what it was submitted."""

    spec: JobSpec
    now: float
    owner: str
    team: str
    source: str | None
    #: The job trains a model, whose next version its output becomes.
    run: ModelRun | None = None


def insert_jobs(
    session: Session, additions: Sequence[Addition], jobs: Sequence[Job]
) -> list[JobRecord]:
    """Insert these new jobs (``jobs[i]`` the job ``additions[i]`` describes), queued, in
    ``session``'s transaction: one insert per table, one change number each; their
    records, in order."""
    ids = new_ids(session, [job.name for job in jobs])
    values: list[dict[str, Any]] = [
        {
            "id": job_id,
            "name": job.name,
            "owner": job.owner,
            "team": job.team,
            "spec": spec.model_dump(mode="json"),
            "state": JobState.QUEUED.value,
            "reason": "waiting for slots",
            "priority": job.priority,
            "target_group": job.placement.group,
            "labels": dict(job.labels),
            "min_slots": job.slot_range.min,
            "max_slots": job.slot_range.max,
            "target_slots": None,
            "scale_deadline": None,
            "scale_previous": None,
            "slots": [],
            "release_slots": [],
            "stopped_replicas": {},
            "reallocations": 0,
            "restarts": 0,
            "cancel_requested": False,
            "attained_service": 0.0,
            "rescale_started_at": None,
            "submitted_at": now,
            "started_at": None,
            "finished_at": None,
            "updated_at": now,
            "change": 0,
        }
        for job_id, job, (spec, now, *_) in zip(ids, jobs, additions, strict=True)
    ]
    # Core inserts, one executemany per table: the ORM's unit of work cost more
    # per job than the database did.
    connection = session.connection()
    connection.execute(insert(JobRow), values)
    connection.execute(
        insert(EventRow),
        [
            {
                "job_id": row["id"],
                "time": row["submitted_at"],
                "kind": "submitted",
                "message": "",
                "data": {},
                "actor": row["owner"],
                "source": addition.source,
            }
            for row, addition in zip(values, additions, strict=True)
        ],
    )
    runs = [(i, a.run) for i, a in zip(ids, additions, strict=True) if a.run]
    if runs:
        insert_runs(session, runs)
    number_changes(session, ids)
    return [JobRecord.of_row(JobRow(**row)) for row in values]


def new_ids(session: Session, names: Sequence[str]) -> list[str]:
    """An unused id ``<name>-<6 hex digits>`` for each name (distinct among them)."""
    ids = [f"{name}-{secrets.token_hex(3)}" for name in names]
    while True:
        taken = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(ids))))
        seen: set[str] = set()
        clash = False
        for i, job_id in enumerate(ids):
            if job_id in taken or job_id in seen:
                ids[i] = f"{names[i]}-{secrets.token_hex(3)}"
                clash = True
            seen.add(ids[i])
        if not clash:
            return ids
