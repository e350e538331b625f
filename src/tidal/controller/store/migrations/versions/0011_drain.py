"""Record the hosts being drained, so a server restart keeps draining them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

A host marked leaving (``tidal drain``, a cloud's preemption notice, Ray's drain notice)
gets no new workers and its jobs move off it: ``host_drains`` holds one row per such
host, with when it was asked, when the host goes (if known) and who asked.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``host_drains`` (empty: no host was draining before)."""
    op.create_table(
        "host_drains",
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("leaves_at", sa.Float(), nullable=True),
        sa.Column("source", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    op.drop_table("host_drains")
