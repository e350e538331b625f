"""Record the workers a user stopped: their slots, until the job has given them up, and
how many replicas of each fixed role the job runs fewer.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

Stopping some of a job's workers (``POST /jobs/{job}/workers/stop``) names their slots;
the job gives exactly those up at its next allocation, also when the server restarts in
between: ``jobs.release_slots`` (``[]`` for every job stored before); a fixed role runs
that many fewer replicas from then on: ``jobs.stopped_replicas`` (``{}``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``jobs.release_slots`` and ``jobs.stopped_replicas`` (empty for every stored
    job)."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("release_slots", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(
            sa.Column("stopped_replicas", sa.JSON(), nullable=False, server_default="{}")
        )


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("stopped_replicas")
        batch.drop_column("release_slots")
