"""Record which role each worker is a replica of, and its index there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

A multi-role job's status counts replicas per role and ``tidal logs --role R --index I``
finds a replica's worker: ``workers.role`` (``worker`` for every worker stored before,
the only role a job had then) and ``workers.replica_index`` (null before: not known).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``workers.role`` (``worker`` for every stored worker) and ``replica_index``."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("role", sa.String(63), nullable=False, server_default="worker"))
        batch.add_column(sa.Column("replica_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("replica_index")
        batch.drop_column("role")
