"""Durable state: jobs, their pending requests, workers, events, the allocation timeline
and training metrics.

SQLAlchemy 2 over any database URL; a SQLite file (WAL mode) by default. Every public
method is one transaction: it commits whole or, on any error, leaves the store as it was.
The tables are in :mod:`~tidal.controller.tables`; what the store hands out, in
:mod:`~tidal.controller.records` (re-exported here, as every caller of the store uses them).
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tidal.backends.base import WorkerState, WorkerStatus
from tidal.controller.job_pages import (
    Cursor,
    JobPage,
    UnreadableJob,
    UnreadableJobError,
    job_heads,
    read_page,
    read_records,
)
from tidal.controller.records import (
    AllocationRecord,
    Event,
    EventRecord,
    GoodputRecord,
    JobRecord,
    MetricRecord,
    WorkerRecord,
)
from tidal.controller.requests import PendingRequest, UserRequest, request_from_row, request_to_row
from tidal.controller.tables import (
    AllocationRow,
    EventRow,
    GoodputRow,
    JobRow,
    MetricRow,
    RequestRow,
    WorkerRow,
    slots_json,
    slots_of,
)
from tidal.model import JobState, JobStateError, check_transition, job_from_spec
from tidal.policy.api import Slot
from tidal.spec import JobSpec

__all__ = [
    "SCHEMA_VERSION",
    "AllocationRecord",
    "Event",
    "EventRecord",
    "GoodputRecord",
    "JobRecord",
    "MetricRecord",
    "Store",
    "StoreError",
    "UnreadableJobError",
    "WorkerRecord",
]

log = logging.getLogger(__name__)

#: What this release writes into the ``schema_version`` table of releases before migrations
#: (they read 1 or 2 and refuse any other number). The Alembic revision in
#: ``alembic_version`` describes the schema (:mod:`tidal.controller.migrations`).
SCHEMA_VERSION = 3


class StoreError(RuntimeError):
    """The store cannot be used (e.g. written by an incompatible version)."""


#: Columns a caller may change through :meth:`Store.update_job`.
_UPDATABLE = frozenset(
    {
        "state",
        "reason",
        "priority",
        "target_workers",
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


#: Milliseconds a SQLite connection of the store waits for a lock another one holds.
SQLITE_BUSY_TIMEOUT_MS = 5000


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    # WAL lets the API read while the controller loop writes. Switching a new file to WAL
    # answers "locked" at once, without the busy timeout, while another connection (a
    # second server starting beside this one) holds a lock on it: retry, bounded.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


#: PostgreSQL advisory lock held while a change is numbered, so numbers follow commits.
_CHANGE_LOCK_KEY = 0x7469_6461_6C01


def _number_change(session: Session, job_id: str) -> None:
    """Give the job's latest change the store's next change number (``jobs.change``).

    Called after the transaction's first write: SQLite holds its one write lock from there
    to the commit (PostgreSQL takes an advisory lock), so numbers are given in commit
    order and a reader that saw change N has seen every change numbered below it."""
    session.flush()
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CHANGE_LOCK_KEY})
    following = select(func.coalesce(func.max(JobRow.change), 0) + 1).scalar_subquery()
    session.execute(
        update(JobRow).where(JobRow.id == job_id).values(change=following),
        execution_options={"synchronize_session": False},
    )


class Store:
    """The controller's database. Safe to share between threads."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = self._engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        #: Called once a new job or a user's request is committed: the controller's loop
        #: wakes on it instead of waiting out its interval.
        self.on_request: Callable[[], None] | None = None
        self._create_schema()

    @classmethod
    def open(cls, data_dir: Path) -> Store:
        """The default store: a SQLite file ``tidal.db`` in ``data_dir``.

        The data dir is made private (0700, when this user owns it) and the database file
        0600: they hold every job's command, environment and the admin token.
        """
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if data_dir.stat().st_uid == os.getuid():
            data_dir.chmod(0o700)
        path = data_dir / "tidal.db"
        # Created here with its mode: SQLite gives the -wal and -shm files the same one.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        path.chmod(0o600)
        return cls(f"sqlite:///{path}")

    @staticmethod
    def _engine(url: str) -> Engine:
        if not url.startswith("sqlite"):
            return create_engine(url, pool_pre_ping=True)
        if url in ("sqlite://", "sqlite:///:memory:"):
            # One shared connection, or every thread would see its own empty database.
            engine = create_engine(
                url, connect_args={"check_same_thread": False}, poolclass=StaticPool
            )
        else:
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 5})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def _create_schema(self) -> None:
        # Imported here: Alembic loads only where a store is opened.
        from tidal.controller import migrations

        try:
            migrations.upgrade(self.engine)
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        """Release database connections."""
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self._sessions() as session, session.begin():
            yield session

    # -- jobs -----------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, now: float | None = None) -> JobRecord:
        """Store a new queued job; its id is ``<name>-<6 hex digits>``."""
        now = time.time() if now is None else now
        job = job_from_spec(spec)
        with self._transaction() as s:
            job_id = f"{job.name}-{secrets.token_hex(3)}"
            while s.get(JobRow, job_id) is not None:
                job_id = f"{job.name}-{secrets.token_hex(3)}"
            row = JobRow(
                id=job_id,
                name=job.name,
                owner=job.owner,
                team=job.team,
                spec=spec.model_dump(mode="json"),
                state=JobState.QUEUED.value,
                reason="waiting for slots",
                priority=job.priority,
                target_group=job.placement.group,
                labels=dict(job.labels),
                min_workers=job.slot_range.min,
                max_workers=job.slot_range.max,
                target_workers=None,
                slots=[],
                reallocations=0,
                restarts=0,
                cancel_requested=False,
                attained_service=0.0,
                submitted_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            s.add(EventRow(job_id=job_id, time=now, kind="submitted", message="", data={}))
            _number_change(s, job_id)
            record = JobRecord.of_row(row)
        self._requested()
        return record

    def get_job(self, job_id: str) -> JobRecord | None:
        """The job with this id, if any; :class:`UnreadableJobError` if its stored row
        cannot be read."""
        with self._transaction() as s:
            head = s.execute(
                select(JobRow.id, JobRow.name, JobRow.submitted_at).where(JobRow.id == job_id)
            ).first()
            return self._record(s, head)

    def resolve(self, ref: str) -> JobRecord | None:
        """A job by id, or else the most recently submitted job with that name;
        :class:`UnreadableJobError` if its stored row cannot be read."""
        heads = select(JobRow.id, JobRow.name, JobRow.submitted_at)
        with self._transaction() as s:
            head = s.execute(heads.where(JobRow.id == ref)).first()
            if head is None:
                head = s.execute(
                    heads.where(JobRow.name == ref)
                    .order_by(JobRow.submitted_at.desc(), JobRow.id.desc())
                    .limit(1)
                ).first()
            return self._record(s, head)

    @staticmethod
    def _record(session: Session, head: Any) -> JobRecord | None:
        """The record of the job ``head`` (id, name, submission time) names, if any."""
        if head is None:
            return None
        (found,) = read_records(session, [(head[0], head[1], head[2])])
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
        query = job_heads(states, name, None)
        if limit is not None and not labels:
            query = query.limit(limit)
        with self._transaction() as s:
            heads = [(i, n, at) for i, n, at in s.execute(query)]
            jobs = [j for j in read_records(s, heads) if isinstance(j, JobRecord)]
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
            return read_page(s, states, name, labels or {}, limit, after, since)

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
        unknown = set(changes) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update job column(s): {', '.join(sorted(unknown))}")
        now = time.time() if now is None else now
        with self._transaction() as s:
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
            for key, value in changes.items():
                setattr(row, key, value.value if isinstance(value, Enum) else value)
            if slots is not None:
                row.slots = slots_json(slots)
                s.add(
                    AllocationRow(
                        job_id=job_id, time=now, count=len(slots), slots=slots_json(slots)
                    )
                )
            if event is not None:
                s.add(
                    EventRow(
                        job_id=job_id,
                        time=now,
                        kind=event.kind,
                        message=event.message,
                        data=dict(event.data or {}),
                    )
                )
            row.updated_at = now
            s.flush()
            record = JobRecord.of_row(row)
            _number_change(s, job_id)
            return record

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
        with self._transaction() as s:
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
                    )
                )
            s.flush()
            pending = PendingRequest(id=row.id, job_id=job_id, time=now, request=request)
            _number_change(s, job_id)
        self._requested()
        return pending

    def _requested(self) -> None:
        if self.on_request is not None:
            self.on_request()

    def pending_requests(
        self, job_ids: Sequence[str] | None = None
    ) -> dict[str, list[PendingRequest]]:
        """Requests not applied yet, oldest first, by job (of ``job_ids`` if given)."""
        query = select(RequestRow).order_by(RequestRow.id)
        if job_ids is not None:
            query = query.where(RequestRow.job_id.in_(list(job_ids)))
        found: dict[str, list[PendingRequest]] = {}
        with self._transaction() as s:
            rows = list(s.scalars(query))
        for r in rows:
            try:
                request = request_from_row(r.kind, r.data)
            except (ValueError, KeyError, TypeError):
                log.warning("request %d of job %s is unreadable; ignored", r.id, r.job_id)
                continue
            found.setdefault(r.job_id, []).append(
                PendingRequest(id=r.id, job_id=r.job_id, time=r.time, request=request)
            )
        return found

    # -- workers --------------------------------------------------------------------------

    def sync_workers(
        self, job_id: str, workers: Sequence[WorkerStatus], now: float | None = None
    ) -> list[WorkerStatus]:
        """Record the backend's view of a job's workers; return those newly seen failed."""
        now = time.time() if now is None else now
        newly_failed: list[WorkerStatus] = []
        with self._transaction() as s:
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
                seen = (w.slot[0], w.slot[1], w.pid, w.state.value, w.exit_code)
                place = (w.role, w.index)
                stored = (row.host, row.slot, row.pid, row.state, row.exit_code)
                if stored == seen and (row.role, row.replica_index) == place:
                    continue
                row.host, row.slot, row.pid = w.slot[0], w.slot[1], w.pid
                row.role, row.replica_index = place
                row.state, row.exit_code = w.state.value, w.exit_code
                if stored != seen:
                    row.updated_at = now
                if w.state is WorkerState.FAILED and previous != WorkerState.FAILED.value:
                    newly_failed.append(w)
        return newly_failed

    def workers(self, job_id: str) -> list[WorkerRecord]:
        """Every worker the job has had, by worker id."""
        with self._transaction() as s:
            rows = s.scalars(
                select(WorkerRow).where(WorkerRow.job_id == job_id).order_by(WorkerRow.worker_id)
            ).all()
            return [
                WorkerRecord(
                    job_id=r.job_id,
                    worker_id=r.worker_id,
                    slot=(r.host, r.slot),
                    pid=r.pid,
                    state=WorkerState(r.state),
                    exit_code=r.exit_code,
                    updated_at=r.updated_at,
                    role=r.role,
                    index=r.replica_index,
                )
                for r in rows
            ]

    # -- events, allocations, metrics -----------------------------------------------------

    def add_event(
        self,
        job_id: str | None,
        kind: str,
        message: str = "",
        data: Mapping[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        """Record an event on its own (job changes record theirs in :meth:`update_job`)."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            s.add(
                EventRow(job_id=job_id, time=now, kind=kind, message=message, data=dict(data or {}))
            )

    def events(
        self, job_id: str | None = None, since: float | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Events in time order (the latest ``limit``), optionally for one job only."""
        query = select(EventRow).order_by(EventRow.time.desc(), EventRow.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(EventRow.job_id == job_id)
        if since is not None:
            query = query.where(EventRow.time >= since)
        with self._transaction() as s:
            rows = list(s.scalars(query))
        return [
            EventRecord(
                id=r.id, job_id=r.job_id, time=r.time, kind=r.kind, message=r.message, data=r.data
            )
            for r in reversed(rows)
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

    def add_metrics(
        self, job_id: str, step: int, values: Mapping[str, float], now: float | None = None
    ) -> None:
        """Record training metrics a job reported at ``step``."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            if s.get(JobRow, job_id) is None:
                raise KeyError(job_id)
            s.add(
                MetricRow(
                    job_id=job_id,
                    step=step,
                    time=now,
                    values={k: float(v) for k, v in values.items()},
                )
            )

    def add_metrics_many(
        self, job_id: str, points: Sequence[tuple[int, float, Mapping[str, float]]]
    ) -> None:
        """Record several ``(step, time, values)`` at once (what the workers logged)."""
        if not points:
            return
        with self._transaction() as s:
            if s.get(JobRow, job_id) is None:
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

    def set_goodput(self, job_id: str, report: Mapping[str, Any], now: float | None = None) -> None:
        """Keep ``report`` as the job's newest goodput report."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            if s.get(JobRow, job_id) is None:
                raise KeyError(job_id)
            row = s.get(GoodputRow, job_id)
            if row is None:
                s.add(GoodputRow(job_id=job_id, time=now, report=dict(report)))
            else:
                row.time, row.report = now, dict(report)
            _number_change(s, job_id)

    def goodput(self, job_ids: Sequence[str] | None = None) -> dict[str, GoodputRecord]:
        """The newest goodput report of each job that sent one (of ``job_ids`` if given)."""
        query = select(GoodputRow)
        if job_ids is not None:
            query = query.where(GoodputRow.job_id.in_(list(job_ids)))
        with self._transaction() as s:
            return {
                r.job_id: GoodputRecord(job_id=r.job_id, time=r.time, report=dict(r.report))
                for r in s.scalars(query)
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

    def latest_metrics(self) -> list[MetricRecord]:
        """Each job's most recently reported metrics (one record per job that reported)."""
        latest = select(func.max(MetricRow.id)).group_by(MetricRow.job_id)
        with self._transaction() as s:
            return [
                MetricRecord(job_id=r.job_id, step=r.step, time=r.time, values=r.values)
                for r in s.scalars(
                    select(MetricRow).where(MetricRow.id.in_(latest)).order_by(MetricRow.job_id)
                )
            ]
