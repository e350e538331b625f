"""Record when each API token was last used, so stale tokens can be found and revoked.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

``tokens.last_used_at``: when a request last came through the token (directly, or through
a dashboard session it opened), kept to the minute. Tokens stored before this revision
have no record of their use: the column starts empty (``never`` in listings).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``tokens.last_used_at`` (empty)."""
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))


def downgrade() -> None:
    """Undo :func:`upgrade`."""
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("last_used_at")
