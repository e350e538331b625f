"""Name a job's size bounds and target for what they count: slots.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27

``jobs.min_workers``, ``max_workers`` and ``target_workers`` have counted slots since
workers could hold several GPUs (revision 0008): a worker of two GPUs holds two. They
become ``min_slots``, ``max_slots`` and ``target_slots``, values unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: Former name -> new name of each renamed column of ``jobs``.
RENAMED = {
    "min_workers": "min_slots",
    "max_workers": "max_slots",
    "target_workers": "target_slots",
}


def upgrade() -> None:
    """Rename the three columns."""
    with op.batch_alter_table("jobs") as batch:
        for old, new in RENAMED.items():
            batch.alter_column(old, new_column_name=new)


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("jobs") as batch:
        for old, new in RENAMED.items():
            batch.alter_column(new, new_column_name=old)
