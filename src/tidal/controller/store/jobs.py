"""Durable state: jobs and their pending requests; through
:class:`~tidal.controller.store.history.JobHistory`, their workers, events, the allocation
timeline, training metrics and goodput.

Every public method is one transaction: it commits whole or, on any error, leaves the
store as it was. The database (engine, schema, transactions) is
:mod:`~tidal.controller.store.database`; the tables are in
:mod:`~tidal.controller.store.tables`; what the store hands out, in
:mod:`~tidal.controller.store.records` (re-exported here, as every caller of the store
uses them); how new jobs' rows are written, in :mod:`~tidal.controller.store.additions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from tidal.controller.store.additions import Addition, insert_jobs
from tidal.controller.store.change_cache import ChangeCache
from tidal.controller.store.database import number_change, number_changes, private_sqlite_url
from tidal.controller.store.drains import HostDrains
from tidal.controller.store.group_commit import GroupCommit
from tidal.controller.store.history import JobHistory
from tidal.controller.store.pages import (
    Cursor,
    JobHead,
    JobPage,
    UnreadableJob,
    UnreadableJobError,
    job_heads,
    read_page,
    read_records,
)
from tidal.controller.store.queries import requests_query, rows
from tidal.controller.store.records import (
    AllocationRecord,
    Event,
    EventRecord,
    GoodputRecord,
    JobRecord,
    MetricRecord,
    WorkerRecord,
)
from tidal.controller.store.registry import ModelRegistry, ModelRun, record_output
from tidal.controller.store.requests import (
    PendingRequest,
    UserRequest,
    request_from_row,
    request_to_row,
)
from tidal.controller.store.tables import AllocationRow, EventRow, JobRow, RequestRow, slots_json
from tidal.model import DEFAULT_OWNER, DEFAULT_TEAM, job_from_spec
from tidal.model_states import JobState, JobStateError, check_transition
from tidal.policy.api import Slot
from tidal.spec import JobSpec

__all__ = [
    "AllocationRecord",
    "Event",
    "EventRecord",
    "GoodputRecord",
    "JobRecord",
    "JobStore",
    "MetricRecord",
    "UnreadableJobError",
    "WorkerRecord",
]

log = logging.getLogger(__name__)

#: Columns a caller may change through :meth:`JobStore.update_job`.
_UPDATABLE = frozenset(
    {
        "state",
        "reason",
        "priority",
        "min_slots",
        "max_slots",
        "target_slots",
        "release_slots",
        "stopped_replicas",
        "scale_deadline",
        "scale_previous",
        "reallocations",
        "restarts",
        "cancel_requested",
        "attained_service",
        "rescale_started_at",
        "started_at",
        "finished_at",
    }
)


class JobStore(JobHistory, HostDrains, ModelRegistry):
    """The controller's database: jobs and their requests, (:class:`JobHistory`) what
    happens to them while they run, (:class:`HostDrains`) the hosts being drained and
    (:class:`ModelRegistry`) the datasets and models they train. Safe to share between
    threads."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        #: Called once a new job or a user's request is committed: the controller's loop
        #: wakes on it instead of waiting out its interval.
        self.on_request: Callable[[], None] | None = None
        #: Records read before, reused while their row has not changed: the loop reads
        #: every active job each tick, and a tick follows each request.
        self.records: ChangeCache[JobRecord] = ChangeCache()
        self._additions: GroupCommit[Addition, JobRecord] = GroupCommit(self._add_jobs)

    @classmethod
    def open(cls, data_dir: Path) -> JobStore:
        """The default store: a SQLite file ``tidal.db`` in ``data_dir``, made private
        (:func:`~tidal.controller.store.database.private_sqlite_url`)."""
        return cls(private_sqlite_url(data_dir))

    # -- jobs -----------------------------------------------------------------------------

    def add_job(
        self,
        spec: JobSpec,
        now: float | None = None,
        *,
        owner: str = DEFAULT_OWNER,
        team: str | None = None,
        source: str | None = None,
        run: ModelRun | None = None,
    ) -> JobRecord:
        """JobStore a new queued job of ``owner`` in ``team`` (``None``: the spec's team, else
        the default team), submitted through ``source``; its id is ``<name>-<6 hex
        digits>``. Jobs added at the same time by several threads are committed together
        (:mod:`.group_commit`). ``run``: the job trains a model, whose next version its
        output becomes."""
        team = team or spec.team or DEFAULT_TEAM
        record = self._additions.add(
            Addition(spec, time.time() if now is None else now, owner, team, source, run)
        )
        self._requested()
        return record

    def _add_jobs(self, additions: Sequence[Addition]) -> list[JobRecord]:
        """Store these new jobs in one transaction (:func:`.additions.insert_jobs`)."""
        jobs = [job_from_spec(a.spec, owner=a.owner, team=a.team) for a in additions]
        with self._transaction(write=True) as s:
            return insert_jobs(s, additions, jobs)

    def get_job(self, job_id: str) -> JobRecord | None:
        """The job with this id, if any; :class:`UnreadableJobError` if its stored row
        cannot be read."""
        with self._transaction() as s:
            heads = job_heads(s, job_id=job_id)
            return self._record(s, heads[0] if heads else None)

    def resolve(self, ref: str) -> JobRecord | None:
        """A job by id, or else the most recently submitted job with that name;
        :class:`UnreadableJobError` if its stored row cannot be read."""
        with self._transaction() as s:
            heads = job_heads(s, job_id=ref) or job_heads(s, name=ref, limit=1, newest_first=True)
            return self._record(s, heads[0] if heads else None)

    def _record(self, session: Session, head: JobHead | None) -> JobRecord | None:
        """The record of the job ``head`` names, if any."""
        if head is None:
            return None
        (found,) = read_records(session, [head], self.records)
        if isinstance(found, UnreadableJob):
            raise UnreadableJobError(found)
        return found

    def list_jobs(
        self,
        states: Sequence[JobState] | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Jobs in submission order, filtered by state, name and labels (all must match).

        A job whose stored row cannot be read is left out (and logged): one bad row must
        not stop the controller loop, which lists the active jobs every tick; the API's
        listing shows it as unreadable (:meth:`job_page`)."""
        with self._transaction() as s:
            heads = job_heads(s, states, name, limit=None if labels else limit)
            jobs = [j for j in read_records(s, heads, self.records) if isinstance(j, JobRecord)]
        if labels:
            # Label filters run here, not in SQL: JSON querying differs between databases.
            jobs = [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]
        return jobs[:limit] if limit is not None else jobs

    def job_page(
        self,
        states: Sequence[JobState] | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        after: Cursor | None = None,
        since: int | None = None,
    ) -> JobPage:
        """A page of jobs in submission order after ``after`` (or, with ``since``, the
        jobs changed after that change number, in the order of their latest change),
        filtered like :meth:`list_jobs`; a row that cannot be read is marked, not raised."""
        with self._transaction() as s:
            return read_page(s, states, name, labels or {}, limit, after, since, self.records)

    def count_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state present, possibly 0); rows whose
        state is not one this release knows (unreadable) are not counted."""
        counts = dict.fromkeys(JobState, 0)
        known = {st.value: st for st in JobState}
        with self._transaction() as s:
            for state, n in s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)):
                if state in known:
                    counts[known[state]] = int(n)
        return counts

    def update_job(
        self,
        job_id: str,
        now: float | None = None,
        *,
        expect: Sequence[JobState] | None = None,
        slots: Sequence[Slot] | None = None,
        event: Event | None = None,
        applied: Sequence[int] = (),
        **changes: Any,
    ) -> JobRecord:
        """Change a job's columns, its slots and record an event, all in one transaction.

        ``expect`` refuses the change (:class:`JobStateError`) unless the job is in one of
        those states when the transaction reads it; so does a change of ``state`` the
        job's state machine does not allow (:func:`tidal.model.check_transition`). New
        ``slots`` are appended to the allocation timeline. ``applied`` names the pending
        requests this change carries out: they are removed with it; a job that ends
        drops whatever requests it still had.
        """
        now = time.time() if now is None else now
        with self._transaction(write=True) as s:
            record = _update_row(s, job_id, now, expect, slots, event, applied, changes)
            number_change(s, job_id)
            return record

    def update_jobs(
        self, updates: Sequence[tuple[str, Event | None, Mapping[str, Any]]], now: float
    ) -> list[JobRecord]:
        """:meth:`update_job` of several jobs (``(job_id, event, changes)`` each) in one
        transaction: a tick that cancels a hundred queued jobs writes once, not a hundred
        times. All or none: a change one job's state forbids fails them all."""
        if not updates:
            return []
        with self._transaction(write=True) as s:
            records = [
                _update_row(s, job_id, now, None, None, event, (), dict(changes))
                for job_id, event, changes in updates
            ]
            number_changes(s, [job_id for job_id, _, _ in updates])
            return records

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self,
        job_id: str,
        request: UserRequest,
        now: float | None = None,
        *,
        expect: Sequence[JobState] | None = None,
        event: Event | None = None,
    ) -> PendingRequest:
        """Record what a user asked of a job (and its event) for the loop to apply.

        ``expect`` refuses it (:class:`JobStateError`) unless the job is in one of those
        states when the transaction reads it.
        """
        now = time.time() if now is None else now
        kind, data = request_to_row(request)
        with self._transaction(write=True) as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise KeyError(job_id)
            if expect is not None and JobState(job.state) not in expect:
                raise JobStateError(f"job {job_id} is {job.state}")
            row = RequestRow(job_id=job_id, time=now, kind=kind, data=data)
            s.add(row)
            if event is not None:
                s.add(
                    EventRow(
                        job_id=job_id,
                        time=now,
                        kind=event.kind,
                        message=event.message,
                        data=dict(event.data or {}),
                        actor=event.actor,
                        source=event.source,
                    )
                )
            s.flush()
            pending = PendingRequest(id=row.id, job_id=job_id, time=now, request=request)
            number_change(s, job_id)
        self._requested()
        return pending

    def _requested(self) -> None:
        if self.on_request is not None:
            self.on_request()

    def pending_requests(
        self, job_ids: Sequence[str] | None = None
    ) -> dict[str, list[PendingRequest]]:
        """Requests not applied yet, oldest first, by job (of ``job_ids`` if given)."""
        query = requests_query(by_jobs=job_ids is not None)
        found: dict[str, list[PendingRequest]] = {}
        with self._transaction() as s:
            pending = rows(s, query, {"job_ids": list(job_ids or ())})
        for r in pending:
            try:
                request = request_from_row(r.kind, r.data)
            except (ValueError, KeyError, TypeError):
                log.warning("request %d of job %s is unreadable; ignored", r.id, r.job_id)
                continue
            found.setdefault(r.job_id, []).append(
                PendingRequest(id=r.id, job_id=r.job_id, time=r.time, request=request)
            )
        return found


def _update_row(
    s: Session,
    job_id: str,
    now: float,
    expect: Sequence[JobState] | None,
    slots: Sequence[Slot] | None,
    event: Event | None,
    applied: Sequence[int],
    changes: Mapping[str, Any],
) -> JobRecord:
    """One job's change in transaction ``s`` (see :meth:`JobStore.update_job`)."""
    unknown = set(changes) - _UPDATABLE
    if unknown:
        raise ValueError(f"cannot update job column(s): {', '.join(sorted(unknown))}")
    row = s.get(JobRow, job_id, with_for_update=True)
    if row is None:
        raise KeyError(job_id)
    old = JobState(row.state)
    if expect is not None and old not in expect:
        raise JobStateError(f"job {job_id} is {row.state}")
    new = JobState(changes.get("state", old))
    check_transition(job_id, old, new)
    if applied:
        s.execute(delete(RequestRow).where(RequestRow.id.in_(list(applied))))
    if new.terminal and not old.terminal:
        s.execute(delete(RequestRow).where(RequestRow.job_id == job_id))
        if new is JobState.SUCCEEDED:
            record_output(s, job_id, now)
    for key, value in changes.items():
        if key == "release_slots":
            value = slots_json(value)
        setattr(row, key, value.value if isinstance(value, Enum) else value)
    if slots is not None:
        row.slots = slots_json(slots)
        # A stopped worker's slot is given up once an allocation leaves it out.
        row.release_slots = [s for s in (row.release_slots or []) if s in row.slots]
        s.add(AllocationRow(job_id=job_id, time=now, count=len(slots), slots=slots_json(slots)))
    if event is not None:
        s.add(
            EventRow(
                job_id=job_id,
                time=now,
                kind=event.kind,
                message=event.message,
                data=dict(event.data or {}),
                actor=event.actor,
                source=event.source,
            )
        )
    row.updated_at = now
    s.flush()
    return JobRecord.of_row(row)
