"""The store's tables (SQLAlchemy ORM rows). Each change to them is a migration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tidal.model import DEFAULT_OWNER, DEFAULT_TEAM
from tidal.policy.api import Slot

__all__ = [
    "AllocationRow",
    "DatasetRow",
    "DatasetVersionRow",
    "EventRow",
    "GoodputRow",
    "HostDrainRow",
    "JobRow",
    "MetricRow",
    "ModelAliasRow",
    "ModelRow",
    "ModelRunRow",
    "ModelVersionRow",
    "RequestRow",
    "SchemaVersionRow",
    "SessionRow",
    "TableBase",
    "TokenRow",
    "UserRow",
    "WorkerRow",
    "slots_json",
    "slots_of",
]


class TableBase(DeclarativeBase):
    """The base of every table of the store."""


class SchemaVersionRow(TableBase):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class JobRow(TableBase):
    __tablename__ = "jobs"
    # The listing's order (submission, then id: its page cursor) alone and after each of
    # its filters, so a page is an index range scan whatever the filter.
    __table_args__ = (
        Index("ix_jobs_submitted_at_id", "submitted_at", "id"),
        Index("ix_jobs_state_submitted_at", "state", "submitted_at", "id"),
        Index("ix_jobs_name_submitted_at", "name", "submitted_at", "id"),
        Index("ix_jobs_change_id", "change", "id"),
    )
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    owner: Mapped[str] = mapped_column(
        String(80), default=DEFAULT_OWNER, server_default=DEFAULT_OWNER
    )
    team: Mapped[str] = mapped_column(String(80), default=DEFAULT_TEAM, server_default=DEFAULT_TEAM)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    priority: Mapped[int] = mapped_column(Integer)
    target_group: Mapped[str | None] = mapped_column(String(200), nullable=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    min_slots: Mapped[int] = mapped_column(Integer)
    max_slots: Mapped[int] = mapped_column(Integer)
    target_slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: A pending scale-out: when it must be satisfied, and the target to restore if not.
    scale_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    scale_previous: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The slots the controller has told the backend to use: ``[[host, index], ...]``.
    slots: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)
    #: Slots of workers a user stopped, given up at the job's next allocation.
    release_slots: Mapped[list[list[Any]]] = mapped_column(JSON, default=list, server_default="[]")
    #: Replicas of each fixed role a user stopped for good: the job runs that many fewer.
    stopped_replicas: Mapped[dict[str, int]] = mapped_column(
        JSON, default=dict, server_default="{}"
    )
    #: How many times the job's allocation changed (started, resized, worker replaced).
    reallocations: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    attained_service: Mapped[float] = mapped_column(Float, default=0.0)
    rescale_started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float, index=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    #: The store's change number of the job's latest change (``GET /jobs?since=``).
    change: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class WorkerRow(TableBase):
    __tablename__ = "workers"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    worker_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    slot: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    #: The role it is a replica of, and its index there (``None``: not known).
    role: Mapped[str] = mapped_column(String(63), default="worker", server_default="worker")
    replica_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: Every slot index it holds on ``host`` when more than one (a replica given several
    #: GPUs); ``[]``: ``slot`` alone.
    slots: Mapped[list[int]] = mapped_column(JSON, default=list, server_default="[]")


class EventRow(TableBase):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: Who made the change (a user's name; ``None``: the server itself) and through what
    #: (``cli``, ``api``, ``dashboard``).
    actor: Mapped[str | None] = mapped_column(String(80), nullable=True, index=True)
    source: Mapped[str | None] = mapped_column(String(16), nullable=True)


class UserRow(TableBase):
    """Someone who may use the server: a role (``admin``, ``member``, ``viewer``) and a
    team, whose jobs a member may change."""

    __tablename__ = "users"
    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    team: Mapped[str] = mapped_column(String(80), default=DEFAULT_TEAM)
    created_at: Mapped[float] = mapped_column(Float)


class TokenRow(TableBase):
    """A user's named API token, kept only as its keyed hash (HMAC-SHA256, hex)."""

    __tablename__ = "tokens"
    __table_args__ = (Index("ix_tokens_user_name", "user", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    user: Mapped[str] = mapped_column(ForeignKey("users.name"))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: When a request last came through the token (or a dashboard session it opened),
    #: to the minute; ``None``: never.
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class SessionRow(TableBase):
    """A dashboard login: the browser holds the session id, the store its keyed hash."""

    __tablename__ = "sessions"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name"))
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AllocationRow(TableBase):
    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    count: Mapped[int] = mapped_column(Integer)
    slots: Mapped[list[list[Any]]] = mapped_column(JSON)


class MetricRow(TableBase):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    values: Mapped[dict[str, float]] = mapped_column(JSON)


class RequestRow(TableBase):
    """A user's request the controller loop has not applied yet."""

    __tablename__ = "requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class GoodputRow(TableBase):
    __tablename__ = "goodput"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)


class HostDrainRow(TableBase):
    """A host marked leaving: it gets no new workers and its jobs move off it."""

    __tablename__ = "host_drains"
    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    requested_at: Mapped[float] = mapped_column(Float)
    #: When the host goes (seconds since the epoch); ``None``: not known.
    leaves_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Who marked it: ``admin``, ``notice`` (a cloud's preemption notice) or ``ray``.
    source: Mapped[str] = mapped_column(String(40))


class DatasetRow(TableBase):
    """A registered dataset; its versions are :class:`DatasetVersionRow`."""

    __tablename__ = "datasets"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    owner: Mapped[str] = mapped_column(String(80))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)


class DatasetVersionRow(TableBase):
    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset", "version", name="uq_dataset_versions"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset: Mapped[str] = mapped_column(ForeignKey("datasets.name"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    location: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(63), default="")
    #: Bytes and SHA-256 of a local path's files at registration; ``None`` for a URL.
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    checksum: Mapped[str | None] = mapped_column(String(64), nullable=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)


class ModelRow(TableBase):
    """A registered model: its code, how it runs, its parameters and its dataset."""

    __tablename__ = "models"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    framework: Mapped[str] = mapped_column(String(63))
    code: Mapped[str] = mapped_column(Text)
    entry_point: Mapped[str] = mapped_column(Text)
    #: The declared parameters (:class:`tidal.wire.registry.ParamSpec` as JSON).
    params: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    dataset: Mapped[str | None] = mapped_column(ForeignKey("datasets.name"), nullable=True)
    owner: Mapped[str] = mapped_column(String(80))
    description: Mapped[str] = mapped_column(Text, default="")
    tags: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)


class ModelVersionRow(TableBase):
    """A finished training job's output: its checkpoint, metrics and lineage."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model", "version", name="uq_model_versions"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(ForeignKey("models.name"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: The dataset version it was trained on: deleting that version is refused.
    dataset_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("dataset_versions.id"), nullable=True, index=True
    )
    created_at: Mapped[float] = mapped_column(Float)


class ModelAliasRow(TableBase):
    __tablename__ = "model_aliases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["model", "version"], ["model_versions.model", "model_versions.version"]
        ),
    )
    model: Mapped[str] = mapped_column(ForeignKey("models.name"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class ModelRunRow(TableBase):
    """A job started from a model: what its output is registered with when it succeeds."""

    __tablename__ = "model_runs"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    model: Mapped[str] = mapped_column(ForeignKey("models.name"), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    dataset_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("dataset_versions.id"), nullable=True, index=True
    )
    checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)


def slots_json(slots: Sequence[Slot]) -> list[list[Any]]:
    """Slots as stored: ``[[host, index], ...]`` in order."""
    return [[h, i] for h, i in sorted(slots)]


def slots_of(raw: Sequence[Sequence[Any]]) -> tuple[Slot, ...]:
    """Stored slots as ``(host, index)`` pairs."""
    return tuple((str(h), int(i)) for h, i in raw)
