"""What happens to jobs while they run: their workers, events, the allocation timeline,
training metrics and goodput reports.

The loop and the workers append these; the API and the dashboard read them. Every public
method is one transaction (:class:`~tidal.controller.store.database.Database`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select

from tidal.controller.store.accounts import Accounts
from tidal.controller.store.database import number_change
from tidal.controller.store.queries import events_query, goodput_query, rows, workers_query
from tidal.controller.store.records import (
    AllocationRecord,
    EventRecord,
    GoodputRecord,
    MetricRecord,
    WorkerRecord,
)
from tidal.controller.store.registry import refresh_output_metrics
from tidal.controller.store.tables import (
    AllocationRow,
    EventRow,
    GoodputRow,
    JobRow,
    MetricRow,
    WorkerRow,
    slots_of,
)
from tidal.launch.api import WorkerState, WorkerStatus
from tidal.model_states import JobState
from tidal.policy.api import Slot

__all__ = ["JobHistory"]


class JobHistory(Accounts):
    """The store's records of jobs at run time (over its users and tokens,
    :class:`~tidal.controller.store.accounts.Accounts`); the base of
    :class:`~tidal.controller.store.jobs.Store`, which adds the jobs and their requests."""

    # -- workers --------------------------------------------------------------------------

    def sync_workers(
        self,
        job_id: str,
        workers: Sequence[WorkerStatus],
        now: float | None = None,
        joined: set[int] | None = None,
    ) -> list[WorkerStatus]:
        """Record the backend's view of a job's workers; return those newly seen failed.

        ``joined``, if given, gets the ids of those the store had seen running (they
        failed after joining their group; the others failed before)."""
        now = time.time() if now is None else now
        newly_failed: list[WorkerStatus] = []
        with self._transaction(write=True) as s:
            known = {
                r.worker_id: r
                for r in s.scalars(select(WorkerRow).where(WorkerRow.job_id == job_id))
            }
            for w in workers:
                row = known.get(w.worker_id)
                if row is None:
                    row = WorkerRow(job_id=job_id, worker_id=w.worker_id, updated_at=now)
                    s.add(row)
                    previous = None
                else:
                    previous = row.state
                indices = [i for _, i in w.slots]
                seen = (w.slot[0], w.slot[1], indices, w.pid, w.state.value, w.exit_code)
                place = (w.role, w.index)
                stored = (row.host, row.slot, row.slots or [], row.pid, row.state, row.exit_code)
                if stored == seen and (row.role, row.replica_index) == place:
                    continue
                row.host, row.slot, row.slots, row.pid = w.slot[0], w.slot[1], indices, w.pid
                row.role, row.replica_index = place
                row.state, row.exit_code = w.state.value, w.exit_code
                if stored != seen:
                    row.updated_at = now
                if w.state is WorkerState.FAILED and previous != WorkerState.FAILED.value:
                    newly_failed.append(w)
                    if joined is not None and previous == WorkerState.RUNNING.value:
                        joined.add(w.worker_id)
        return newly_failed

    def workers(self, job_id: str) -> list[WorkerRecord]:
        """Every worker the job has had, by worker id."""
        with self._transaction() as s:
            found = rows(s, workers_query, {"job_id": job_id})
        return [
            WorkerRecord(
                job_id=r.job_id,
                worker_id=r.worker_id,
                slot=(r.host, r.slot),
                slots=tuple((r.host, int(i)) for i in r.slots or ()),
                pid=r.pid,
                state=WorkerState(r.state),
                exit_code=r.exit_code,
                updated_at=r.updated_at,
                role=r.role,
                index=r.replica_index,
            )
            for r in found
        ]

    # -- events, allocations, metrics -----------------------------------------------------

    def add_event(
        self,
        job_id: str | None,
        kind: str,
        message: str = "",
        data: Mapping[str, Any] | None = None,
        now: float | None = None,
        *,
        actor: str | None = None,
        source: str | None = None,
    ) -> None:
        """Record an event on its own (job changes record theirs in
        :meth:`~tidal.controller.store.jobs.Store.update_job`); ``actor``: the user who
        made the change, through ``source``."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            s.add(
                EventRow(
                    job_id=job_id,
                    time=now,
                    kind=kind,
                    message=message,
                    data=dict(data or {}),
                    actor=actor,
                    source=source,
                )
            )

    def events(
        self,
        job_id: str | None = None,
        since: float | None = None,
        limit: int = 1000,
        *,
        actor: str | None = None,
    ) -> list[EventRecord]:
        """Events in time order (the latest ``limit``), optionally for one job only and
        of one user's changes only (``actor``)."""
        query = events_query(
            by_job=job_id is not None, since=since is not None, by_actor=actor is not None
        )
        with self._transaction() as s:
            found = rows(
                s, query, {"job_id": job_id, "since": since, "limit": limit, "actor": actor}
            )
        return [
            EventRecord(
                id=r.id,
                job_id=r.job_id,
                time=r.time,
                kind=r.kind,
                message=r.message,
                data=r.data,
                actor=r.actor,
                source=r.source,
            )
            for r in reversed(found)
        ]

    def allocations(
        self, job_id: str | None = None, since: float | None = None
    ) -> list[AllocationRecord]:
        """The allocation timeline in time order, optionally for one job only."""
        query = select(AllocationRow).order_by(AllocationRow.time, AllocationRow.id)
        if job_id is not None:
            query = query.where(AllocationRow.job_id == job_id)
        if since is not None:
            query = query.where(AllocationRow.time >= since)
        with self._transaction() as s:
            return [
                AllocationRecord(
                    job_id=r.job_id, time=r.time, count=r.count, slots=slots_of(r.slots)
                )
                for r in s.scalars(query)
            ]

    def job_teams(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The team of each of ``job_ids`` the store holds (what the team charts group
        the allocation timeline by)."""
        if not job_ids:
            return {}
        query = select(JobRow.id, JobRow.team).where(JobRow.id.in_(list(job_ids)))
        with self._transaction() as s:
            return {job_id: team for job_id, team in s.execute(query)}

    def previous_slots(self, job_id: str) -> tuple[Slot, ...] | None:
        """The slots the job held before its latest allocation (``None``: it had none)."""
        query = (
            select(AllocationRow.slots)
            .where(AllocationRow.job_id == job_id)
            .order_by(AllocationRow.time.desc(), AllocationRow.id.desc())
            .limit(2)
        )
        with self._transaction() as s:
            rows = list(s.scalars(query))
        return slots_of(rows[1]) if len(rows) == 2 else None

    def add_metrics(
        self, job_id: str, step: int, values: Mapping[str, float], now: float | None = None
    ) -> None:
        """Record training metrics a job reported at ``step``."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise KeyError(job_id)
            s.add(
                MetricRow(
                    job_id=job_id,
                    step=step,
                    time=now,
                    values={k: float(v) for k, v in values.items()},
                )
            )
            if job.state == JobState.SUCCEEDED.value:
                refresh_output_metrics(s, job_id)

    def add_metrics_many(
        self, job_id: str, points: Sequence[tuple[int, float, Mapping[str, float]]]
    ) -> None:
        """Record several ``(step, time, values)`` at once (what the workers logged)."""
        if not points:
            return
        with self._transaction(write=True) as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise KeyError(job_id)
            s.add_all(
                MetricRow(
                    job_id=job_id,
                    step=step,
                    time=at,
                    values={k: float(v) for k, v in values.items()},
                )
                for step, at, values in points
            )
            if job.state == JobState.SUCCEEDED.value:
                refresh_output_metrics(s, job_id)

    def set_goodput(self, job_id: str, report: Mapping[str, Any], now: float | None = None) -> None:
        """Keep ``report`` as the job's newest goodput report."""
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            if s.get(JobRow, job_id) is None:
                raise KeyError(job_id)
            row = s.get(GoodputRow, job_id)
            if row is None:
                s.add(GoodputRow(job_id=job_id, time=now, report=dict(report)))
            else:
                row.time, row.report = now, dict(report)
            number_change(s, job_id)

    def goodput(
        self, job_ids: Sequence[str] | None = None, states: Sequence[JobState] | None = None
    ) -> dict[str, GoodputRecord]:
        """The newest goodput report of each job that sent one (of ``job_ids`` if given, of
        jobs in ``states`` if given)."""
        query = goodput_query(by_jobs=job_ids is not None, by_states=states is not None)
        params = {
            "job_ids": list(job_ids or ()),
            "states": [state.value for state in states or ()],
        }
        with self._transaction() as s:
            found = rows(s, query, params)
        return {
            r.job_id: GoodputRecord(job_id=r.job_id, time=r.time, report=dict(r.report))
            for r in found
        }

    def metrics(self, job_id: str) -> list[MetricRecord]:
        """A job's metrics in step order."""
        with self._transaction() as s:
            return [
                MetricRecord(job_id=r.job_id, step=r.step, time=r.time, values=r.values)
                for r in s.scalars(
                    select(MetricRow)
                    .where(MetricRow.job_id == job_id)
                    .order_by(MetricRow.step, MetricRow.id)
                )
            ]

    def latest_metrics(self, team: str | None = None) -> list[MetricRecord]:
        """Each job's most recently reported metrics (one record per job that reported),
        of ``team``'s jobs only if given."""
        latest = select(func.max(MetricRow.id)).group_by(MetricRow.job_id)
        query = select(MetricRow).where(MetricRow.id.in_(latest)).order_by(MetricRow.job_id)
        if team is not None:
            query = query.where(MetricRow.job_id.in_(select(JobRow.id).where(JobRow.team == team)))
        with self._transaction() as s:
            return [
                MetricRecord(job_id=r.job_id, step=r.step, time=r.time, values=r.values)
                for r in s.scalars(query)
            ]
