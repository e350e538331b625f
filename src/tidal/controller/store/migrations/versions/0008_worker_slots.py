"""Record every slot a worker holds: a replica may be given several GPUs.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24

A role's ``resources.gpus`` above 1 gives each of its replicas that many slots, all on one
host. ``workers.slot`` keeps the first; ``workers.slots`` lists every slot index it holds
on ``workers.host`` when there is more than one (``[]`` for every worker stored before,
each of which held one slot).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``workers.slots`` (empty for every stored worker)."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("slots", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("slots")
