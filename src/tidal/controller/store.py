"""Durable state: jobs, workers, events, the allocation timeline and training metrics.

SQLAlchemy 2 over any database URL; a SQLite file (WAL mode) by default. Every public
method is one transaction: it commits whole or, on any error, leaves the store as it was.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from tidal.backends.base import WorkerState, WorkerStatus
from tidal.policy.api import Slot
from tidal.spec import JobSpec

__all__ = [
    "SCHEMA_VERSION",
    "AllocationRecord",
    "Event",
    "EventRecord",
    "GoodputRecord",
    "JobRecord",
    "JobState",
    "JobStateError",
    "MetricRecord",
    "Store",
    "StoreError",
    "WorkerRecord",
]

log = logging.getLogger(__name__)

#: What this release writes into the ``schema_version`` table of releases before migrations
#: (they read 1 or 2 and refuse any other number). The Alembic revision in
#: ``alembic_version`` describes the schema (:mod:`tidal.controller.migrations`).
SCHEMA_VERSION = 3


class JobState(str, Enum):
    """A job's life: queued → running ⇄ rescaling → succeeded | failed | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    RESCALING = "rescaling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the job is over for good."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def holds_slots(self) -> bool:
        """Whether the job's workers occupy slots in this state."""
        return self in (JobState.RUNNING, JobState.RESCALING)


ACTIVE_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.RESCALING)


class StoreError(RuntimeError):
    """The store cannot be used (e.g. written by an incompatible version)."""


class JobStateError(ValueError):
    """A request does not fit the job's current state (e.g. scaling a finished job)."""


class _Base(DeclarativeBase):
    pass


class _SchemaVersionRow(_Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class _JobRow(_Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    priority: Mapped[int] = mapped_column(Integer)
    target_group: Mapped[str | None] = mapped_column(String(200), nullable=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    min_workers: Mapped[int] = mapped_column(Integer)
    max_workers: Mapped[int] = mapped_column(Integer)
    target_workers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: A pending scale-out: when it must be satisfied, and the target to restore if not.
    scale_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    scale_previous: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The slots the controller has told the backend to use: ``[[host, index], ...]``.
    slots: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    attained_service: Mapped[float] = mapped_column(Float, default=0.0)
    rescale_started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float, index=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class _WorkerRow(_Base):
    __tablename__ = "workers"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    worker_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    slot: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class _EventRow(_Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class _AllocationRow(_Base):
    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    count: Mapped[int] = mapped_column(Integer)
    slots: Mapped[list[list[Any]]] = mapped_column(JSON)


class _MetricRow(_Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    values: Mapped[dict[str, float]] = mapped_column(JSON)


class _GoodputRow(_Base):
    __tablename__ = "goodput"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)


def _slots_json(slots: Sequence[Slot]) -> list[list[Any]]:
    return [[h, i] for h, i in sorted(slots)]


def _slots(raw: Sequence[Sequence[Any]]) -> tuple[Slot, ...]:
    return tuple((str(h), int(i)) for h, i in raw)


@dataclass(frozen=True)
class JobRecord:
    """A job as stored (a detached snapshot)."""

    id: str
    name: str
    #: The spec as stored (JSON); :attr:`spec` parses it on first use.
    spec_data: Mapping[str, Any]
    state: JobState
    reason: str
    priority: int
    target_group: str | None
    labels: Mapping[str, str]
    min_workers: int
    max_workers: int
    target_workers: int | None
    scale_deadline: float | None
    scale_previous: int | None
    slots: tuple[Slot, ...]
    generation: int
    restarts: int
    cancel_requested: bool
    attained_service: float
    rescale_started_at: float | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float

    @cached_property
    def spec(self) -> JobSpec:
        """The job's spec (validated when it was submitted, so parsing cannot fail)."""
        return JobSpec.model_validate(self.spec_data)

    @classmethod
    def _of(cls, row: _JobRow) -> JobRecord:
        return cls(
            id=row.id,
            name=row.name,
            spec_data=row.spec,
            state=JobState(row.state),
            reason=row.reason,
            priority=row.priority,
            target_group=row.target_group,
            labels=dict(row.labels or {}),
            min_workers=row.min_workers,
            max_workers=row.max_workers,
            target_workers=row.target_workers,
            scale_deadline=row.scale_deadline,
            scale_previous=row.scale_previous,
            slots=_slots(row.slots or []),
            generation=row.generation,
            restarts=row.restarts,
            cancel_requested=row.cancel_requested,
            attained_service=row.attained_service,
            rescale_started_at=row.rescale_started_at,
            submitted_at=row.submitted_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            updated_at=row.updated_at,
        )


@dataclass(frozen=True)
class WorkerRecord:
    """The last known state of one worker."""

    job_id: str
    worker_id: int
    slot: Slot
    pid: int | None
    state: WorkerState
    exit_code: int | None
    updated_at: float


@dataclass(frozen=True)
class EventRecord:
    """Something that happened, for the user to read (``tidal get``, the events API)."""

    id: int
    job_id: str | None
    time: float
    kind: str
    message: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class AllocationRecord:
    """From ``time`` on, the job held ``slots`` (``count`` of them); what charts draw."""

    job_id: str
    time: float
    count: int
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class MetricRecord:
    """Training metrics a job reported at one step."""

    job_id: str
    step: int
    time: float
    values: Mapping[str, float]


@dataclass(frozen=True)
class GoodputRecord:
    """The newest goodput report of a job's workers (see ``tidal.runtime.adaptive``):
    fitted throughput model, gradient noise scale, chosen batch, efficiency, speed-up."""

    job_id: str
    time: float
    report: Mapping[str, Any]


@dataclass(frozen=True)
class Event:
    """An event to record together with a job change, in the same transaction."""

    kind: str
    message: str = ""
    data: Mapping[str, Any] | None = None


#: Columns a caller may change through :meth:`Store.update_job`.
_UPDATABLE = frozenset(
    {
        "state",
        "reason",
        "priority",
        "target_workers",
        "scale_deadline",
        "scale_previous",
        "generation",
        "restarts",
        "cancel_requested",
        "attained_service",
        "rescale_started_at",
        "started_at",
        "finished_at",
    }
)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    # WAL lets the API read while the controller loop writes.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class Store:
    """The controller's database. Safe to share between threads."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = self._engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
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
        with self._transaction() as s:
            job_id = f"{spec.name}-{secrets.token_hex(3)}"
            while s.get(_JobRow, job_id) is not None:
                job_id = f"{spec.name}-{secrets.token_hex(3)}"
            row = _JobRow(
                id=job_id,
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                state=JobState.QUEUED.value,
                reason="waiting for slots",
                priority=spec.priority,
                target_group=spec.target.group,
                labels=dict(spec.labels),
                min_workers=spec.workers.min,
                max_workers=spec.workers.max_workers,
                target_workers=None,
                slots=[],
                generation=0,
                restarts=0,
                cancel_requested=False,
                attained_service=0.0,
                submitted_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            s.add(_EventRow(job_id=job_id, time=now, kind="submitted", message="", data={}))
            return JobRecord._of(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        """The job with this id, if any."""
        with self._transaction() as s:
            row = s.get(_JobRow, job_id)
            return JobRecord._of(row) if row else None

    def resolve(self, ref: str) -> JobRecord | None:
        """A job by id, or else the most recently submitted job with that name."""
        with self._transaction() as s:
            row = s.get(_JobRow, ref)
            if row is None:
                row = s.scalars(
                    select(_JobRow)
                    .where(_JobRow.name == ref)
                    .order_by(_JobRow.submitted_at.desc(), _JobRow.id.desc())
                    .limit(1)
                ).first()
            return JobRecord._of(row) if row else None

    def list_jobs(
        self,
        states: Sequence[JobState] | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Jobs in submission order, filtered by state, name and labels (all must match)."""
        query = select(_JobRow).order_by(_JobRow.submitted_at, _JobRow.id)
        if states:
            query = query.where(_JobRow.state.in_([st.value for st in states]))
        if name is not None:
            query = query.where(_JobRow.name == name)
        if limit is not None and not labels:
            query = query.limit(limit)
        with self._transaction() as s:
            rows = s.scalars(query).all()
            jobs = [JobRecord._of(r) for r in rows]
        if labels:
            # Label filters run here, not in SQL: JSON querying differs between databases.
            jobs = [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]
        return jobs[:limit] if limit is not None else jobs

    def count_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state present, possibly 0)."""
        counts = dict.fromkeys(JobState, 0)
        with self._transaction() as s:
            for state, n in s.execute(select(_JobRow.state, func.count()).group_by(_JobRow.state)):
                counts[JobState(state)] = int(n)
        return counts

    def update_job(
        self,
        job_id: str,
        now: float | None = None,
        *,
        expect: Sequence[JobState] | None = None,
        slots: Sequence[Slot] | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> JobRecord:
        """Change a job's columns, its slots and record an event, all in one transaction.

        ``expect`` refuses the change (:class:`JobStateError`) unless the job is in one of
        those states when the transaction reads it. New ``slots`` are appended to the
        allocation timeline.
        """
        unknown = set(changes) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update job column(s): {', '.join(sorted(unknown))}")
        now = time.time() if now is None else now
        with self._transaction() as s:
            row = s.get(_JobRow, job_id, with_for_update=True)
            if row is None:
                raise KeyError(job_id)
            if expect is not None and JobState(row.state) not in expect:
                raise JobStateError(f"job {job_id} is {row.state}")
            for key, value in changes.items():
                setattr(row, key, value.value if isinstance(value, Enum) else value)
            if slots is not None:
                row.slots = _slots_json(slots)
                s.add(
                    _AllocationRow(
                        job_id=job_id, time=now, count=len(slots), slots=_slots_json(slots)
                    )
                )
            if event is not None:
                s.add(
                    _EventRow(
                        job_id=job_id,
                        time=now,
                        kind=event.kind,
                        message=event.message,
                        data=dict(event.data or {}),
                    )
                )
            row.updated_at = now
            s.flush()
            return JobRecord._of(row)

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
                for r in s.scalars(select(_WorkerRow).where(_WorkerRow.job_id == job_id))
            }
            for w in workers:
                row = known.get(w.worker_id)
                if row is None:
                    row = _WorkerRow(job_id=job_id, worker_id=w.worker_id, updated_at=now)
                    s.add(row)
                    previous = None
                else:
                    previous = row.state
                changed = (row.host, row.slot, row.pid, row.state, row.exit_code) != (
                    w.slot[0],
                    w.slot[1],
                    w.pid,
                    w.state.value,
                    w.exit_code,
                )
                if not changed:
                    continue
                row.host, row.slot, row.pid = w.slot[0], w.slot[1], w.pid
                row.state, row.exit_code, row.updated_at = w.state.value, w.exit_code, now
                if w.state is WorkerState.FAILED and previous != WorkerState.FAILED.value:
                    newly_failed.append(w)
        return newly_failed

    def workers(self, job_id: str) -> list[WorkerRecord]:
        """Every worker the job has had, by worker id."""
        with self._transaction() as s:
            rows = s.scalars(
                select(_WorkerRow).where(_WorkerRow.job_id == job_id).order_by(_WorkerRow.worker_id)
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
                _EventRow(
                    job_id=job_id, time=now, kind=kind, message=message, data=dict(data or {})
                )
            )

    def events(
        self, job_id: str | None = None, since: float | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Events in time order (the latest ``limit``), optionally for one job only."""
        query = select(_EventRow).order_by(_EventRow.time.desc(), _EventRow.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(_EventRow.job_id == job_id)
        if since is not None:
            query = query.where(_EventRow.time >= since)
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
        query = select(_AllocationRow).order_by(_AllocationRow.time, _AllocationRow.id)
        if job_id is not None:
            query = query.where(_AllocationRow.job_id == job_id)
        if since is not None:
            query = query.where(_AllocationRow.time >= since)
        with self._transaction() as s:
            return [
                AllocationRecord(job_id=r.job_id, time=r.time, count=r.count, slots=_slots(r.slots))
                for r in s.scalars(query)
            ]

    def add_metrics(
        self, job_id: str, step: int, values: Mapping[str, float], now: float | None = None
    ) -> None:
        """Record training metrics a job reported at ``step``."""
        now = time.time() if now is None else now
        with self._transaction() as s:
            if s.get(_JobRow, job_id) is None:
                raise KeyError(job_id)
            s.add(
                _MetricRow(
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
            if s.get(_JobRow, job_id) is None:
                raise KeyError(job_id)
            s.add_all(
                _MetricRow(
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
            if s.get(_JobRow, job_id) is None:
                raise KeyError(job_id)
            row = s.get(_GoodputRow, job_id)
            if row is None:
                s.add(_GoodputRow(job_id=job_id, time=now, report=dict(report)))
            else:
                row.time, row.report = now, dict(report)

    def goodput(self, job_ids: Sequence[str] | None = None) -> dict[str, GoodputRecord]:
        """The newest goodput report of each job that sent one (of ``job_ids`` if given)."""
        query = select(_GoodputRow)
        if job_ids is not None:
            query = query.where(_GoodputRow.job_id.in_(list(job_ids)))
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
                    select(_MetricRow)
                    .where(_MetricRow.job_id == job_id)
                    .order_by(_MetricRow.step, _MetricRow.id)
                )
            ]

    def latest_metrics(self) -> list[MetricRecord]:
        """Each job's most recently reported metrics (one record per job that reported)."""
        latest = select(func.max(_MetricRow.id)).group_by(_MetricRow.job_id)
        with self._transaction() as s:
            return [
                MetricRecord(job_id=r.job_id, step=r.step, time=r.time, values=r.values)
                for r in s.scalars(
                    select(_MetricRow).where(_MetricRow.id.in_(latest)).order_by(_MetricRow.job_id)
                )
            ]
