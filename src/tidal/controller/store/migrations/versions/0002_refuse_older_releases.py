"""Mark the store as migrated, so releases before migrations refuse it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Those releases read ``schema_version`` and accept only 1 and 2; 3 makes them stop with
"schema version 3" instead of writing rows a later revision's schema does not expect.
From here on the revision in ``alembic_version`` describes the schema.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_version = sa.table("schema_version", sa.column("version", sa.Integer()))


def upgrade() -> None:
    """Record schema version 3."""
    op.execute(sa.update(_version).values(version=3))


def downgrade() -> None:
    """Record schema version 2 again (the baseline)."""
    op.execute(sa.update(_version).values(version=2))
