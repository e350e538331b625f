"""The registry: datasets and their versions, models, their versions, aliases and runs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

A dataset has numbered versions (a location, a format, and for a local path the size and
checksum measured at registration). A model names its code, entry point, typed
parameters and dataset; a job started from it is a run (``model_runs``) whose output,
when it succeeds, becomes the model's next version, pointing at the dataset version it
was trained on. Stores before this revision hold none of these: the tables start empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the six tables and their indexes."""
    op.create_table(
        "datasets",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("owner", sa.String(length=80), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset", sa.String(length=63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("format", sa.String(length=63), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("checksum", sa.String(length=64), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["dataset"], ["datasets.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("dataset", "version", name="uq_dataset_versions"),
    )
    op.create_index("ix_dataset_versions_dataset", "dataset_versions", ["dataset"])
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("framework", sa.String(length=63), nullable=False),
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("entry_point", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("dataset", sa.String(length=63), nullable=True),
        sa.Column("owner", sa.String(length=80), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["dataset"], ["datasets.name"]),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("dataset_version_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_version_id"], ["dataset_versions.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["model"], ["models.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model", "version", name="uq_model_versions"),
    )
    op.create_index("ix_model_versions_model", "model_versions", ["model"])
    op.create_index("ix_model_versions_job_id", "model_versions", ["job_id"])
    op.create_index(
        "ix_model_versions_dataset_version_id", "model_versions", ["dataset_version_id"]
    )
    op.create_table(
        "model_aliases",
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("alias", sa.String(length=63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["model"], ["models.name"]),
        sa.ForeignKeyConstraint(
            ["model", "version"], ["model_versions.model", "model_versions.version"]
        ),
        sa.PrimaryKeyConstraint("model", "alias"),
    )
    op.create_table(
        "model_runs",
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("dataset_version_id", sa.Integer(), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["dataset_version_id"], ["dataset_versions.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["model"], ["models.name"]),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_model_runs_model", "model_runs", ["model"])
    op.create_index("ix_model_runs_dataset_version_id", "model_runs", ["dataset_version_id"])


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    for table in (
        "model_runs",
        "model_aliases",
        "model_versions",
        "models",
        "dataset_versions",
        "datasets",
    ):
        op.drop_table(table)
