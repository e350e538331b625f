"""Indexes for listing jobs a page at a time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

The listing orders by submission time then id (its page cursor) after filtering by state
or name; each index covers one of those, so a page is a range scan of an index instead of
a sort of every job.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_INDEXES = {
    "ix_jobs_submitted_at_id": ["submitted_at", "id"],
    "ix_jobs_state_submitted_at": ["state", "submitted_at", "id"],
    "ix_jobs_name_submitted_at": ["name", "submitted_at", "id"],
}


def upgrade() -> None:
    """Create the listing's indexes on ``jobs``."""
    for name, columns in _INDEXES.items():
        op.create_index(name, "jobs", columns)


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    for name in reversed(_INDEXES):
        op.drop_index(name, table_name="jobs")
