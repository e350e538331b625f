"""The job model: owners and teams, users' requests as rows, the allocation counter named.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

``jobs`` gains ``owner`` and ``team`` (existing jobs belong to the single admin, as every
job did), its ``generation`` column becomes ``reallocations`` (it counts allocation
changes; "generation" is the rendezvous's word), and ``requests`` holds what users asked
of a job through the API until the controller loop applies it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add owner and team, rename the allocation counter, create ``requests``."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(80), nullable=False, server_default="admin"))
        batch.add_column(sa.Column("team", sa.String(80), nullable=False, server_default="default"))
        batch.alter_column(
            "generation",
            new_column_name="reallocations",
            existing_type=sa.Integer(),
            existing_nullable=False,
        )
    op.create_table(
        "requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_index("ix_requests_job_id", "requests", ["job_id"])


def downgrade() -> None:
    """Drop ``requests`` (pending requests are lost), owner and team; name the counter
    ``generation`` again."""
    op.drop_index("ix_requests_job_id", table_name="requests")
    op.drop_table("requests")
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column(
            "reallocations",
            new_column_name="generation",
            existing_type=sa.Integer(),
            existing_nullable=False,
        )
        batch.drop_column("team")
        batch.drop_column("owner")
