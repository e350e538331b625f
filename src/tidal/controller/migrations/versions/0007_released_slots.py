"""Record the slots of workers a user stopped, until the job has given them up.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

Stopping some of a job's workers (``POST /jobs/{job}/workers/stop``) names their slots;
the job gives exactly those up at its next allocation, also when the server restarts in
between: ``jobs.release_slots`` (``[]`` for every job stored before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``jobs.release_slots`` (empty for every stored job)."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("release_slots", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("release_slots")
