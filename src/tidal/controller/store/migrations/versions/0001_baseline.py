"""Baseline: the schema of the last release before migrations (schema version 2).

Revision ID: 0001
Revises:
Create Date: 2026-11-23

A store written by that release (``schema_version`` 1 or 2, no ``alembic_version``) is
adopted by this revision: it creates only the tables the store lacks (version 1 had no
``goodput``) and records version 2 (see :func:`tidal.controller.store.migrations.upgrade`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

#: What the pre-migration releases wrote into ``schema_version`` for this schema.
BASELINE_SCHEMA_VERSION = 2


def _tables() -> list[tuple[str, list[sa.schema.SchemaItem], list[tuple[str, str]]]]:
    """Each table: its name, columns and constraints, and its indexes (name, column)."""
    return [
        ("schema_version", [sa.Column("version", sa.Integer(), primary_key=True)], []),
        (
            "jobs",
            [
                sa.Column("id", sa.String(80), primary_key=True),
                sa.Column("name", sa.String(63), nullable=False),
                sa.Column("spec", sa.JSON(), nullable=False),
                sa.Column("state", sa.String(16), nullable=False),
                sa.Column("reason", sa.Text(), nullable=False),
                sa.Column("priority", sa.Integer(), nullable=False),
                sa.Column("target_group", sa.String(200), nullable=True),
                sa.Column("labels", sa.JSON(), nullable=False),
                sa.Column("min_workers", sa.Integer(), nullable=False),
                sa.Column("max_workers", sa.Integer(), nullable=False),
                sa.Column("target_workers", sa.Integer(), nullable=True),
                sa.Column("scale_deadline", sa.Float(), nullable=True),
                sa.Column("scale_previous", sa.Integer(), nullable=True),
                sa.Column("slots", sa.JSON(), nullable=False),
                sa.Column("generation", sa.Integer(), nullable=False),
                sa.Column("restarts", sa.Integer(), nullable=False),
                sa.Column("cancel_requested", sa.Boolean(), nullable=False),
                sa.Column("attained_service", sa.Float(), nullable=False),
                sa.Column("rescale_started_at", sa.Float(), nullable=True),
                sa.Column("submitted_at", sa.Float(), nullable=False),
                sa.Column("started_at", sa.Float(), nullable=True),
                sa.Column("finished_at", sa.Float(), nullable=True),
                sa.Column("updated_at", sa.Float(), nullable=False),
            ],
            [
                ("ix_jobs_name", "name"),
                ("ix_jobs_state", "state"),
                ("ix_jobs_submitted_at", "submitted_at"),
            ],
        ),
        (
            "workers",
            [
                sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), primary_key=True),
                sa.Column("worker_id", sa.Integer(), primary_key=True),
                sa.Column("host", sa.String(200), nullable=False),
                sa.Column("slot", sa.Integer(), nullable=False),
                sa.Column("pid", sa.Integer(), nullable=True),
                sa.Column("state", sa.String(16), nullable=False),
                sa.Column("exit_code", sa.Integer(), nullable=True),
                sa.Column("updated_at", sa.Float(), nullable=False),
            ],
            [],
        ),
        (
            "events",
            [
                sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
                sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), nullable=True),
                sa.Column("time", sa.Float(), nullable=False),
                sa.Column("kind", sa.String(40), nullable=False),
                sa.Column("message", sa.Text(), nullable=False),
                sa.Column("data", sa.JSON(), nullable=False),
            ],
            [("ix_events_job_id", "job_id"), ("ix_events_time", "time")],
        ),
        (
            "allocations",
            [
                sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
                sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), nullable=False),
                sa.Column("time", sa.Float(), nullable=False),
                sa.Column("count", sa.Integer(), nullable=False),
                sa.Column("slots", sa.JSON(), nullable=False),
            ],
            [("ix_allocations_job_id", "job_id"), ("ix_allocations_time", "time")],
        ),
        (
            "metrics",
            [
                sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
                sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), nullable=False),
                sa.Column("step", sa.Integer(), nullable=False),
                sa.Column("time", sa.Float(), nullable=False),
                sa.Column("values", sa.JSON(), nullable=False),
            ],
            [("ix_metrics_job_id", "job_id")],
        ),
        (
            "goodput",
            [
                sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), primary_key=True),
                sa.Column("time", sa.Float(), nullable=False),
                sa.Column("report", sa.JSON(), nullable=False),
            ],
            [],
        ),
    ]


def upgrade() -> None:
    """Create the tables the store lacks and record schema version 2."""
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for name, items, indexes in _tables():
        if name in existing:
            continue
        op.create_table(name, *items)
        for index, column in indexes:
            op.create_index(index, name, [column])
    version = sa.table("schema_version", sa.column("version", sa.Integer()))
    op.execute(sa.delete(version))
    op.execute(sa.insert(version).values(version=BASELINE_SCHEMA_VERSION))


def downgrade() -> None:
    """Drop every table (the store is empty afterwards)."""
    for name, _items, _indexes in reversed(_tables()):
        op.drop_table(name)
