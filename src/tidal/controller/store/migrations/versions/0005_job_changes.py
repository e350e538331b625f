"""Number each job's latest change, for listing only the jobs that changed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

``jobs.change`` is the store's change number of the job's latest change (its row, a request
made of it, a goodput report): every change takes one more than the highest so far, so
``GET /jobs?since=N`` is an index range scan of the jobs changed after change ``N``. Jobs
stored before this revision start at 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``jobs.change`` (0 for every stored job) and its index."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("change", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_jobs_change_id", "jobs", ["change", "id"])


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    op.drop_index("ix_jobs_change_id", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("change")
