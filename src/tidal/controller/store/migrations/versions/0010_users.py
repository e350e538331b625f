"""Users, their tokens and dashboard sessions; who made each change.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

``users`` (a role and a team each), ``tokens`` (named, stored as a keyed hash only, with
an optional expiry and a revocation time) and ``sessions`` (dashboard logins) are created;
``events`` gains ``actor`` and ``source``. The store's single admin becomes the user
``admin`` (role ``admin``, team ``default``), the owner every stored job already names;
the server registers the data dir's token as that user's on its next start (the server's
key for hashing tokens is in the data dir, not in the store). Stored events have no actor.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the three tables with the admin user; add the events' actor and source."""
    users = op.create_table(
        "users",
        sa.Column("name", sa.String(80), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("team", sa.String(80), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("user", sa.String(80), sa.ForeignKey("users.name"), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_tokens_user_name", "tokens", ["user", "name"])
    op.create_table(
        "sessions",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(80), sa.ForeignKey("users.name"), nullable=False),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("tokens.id"), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_sessions_token_id", "sessions", ["token_id"])
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("actor", sa.String(80), nullable=True))
        batch.add_column(sa.Column("source", sa.String(16), nullable=True))
    op.create_index("ix_events_actor", "events", ["actor"])
    op.bulk_insert(
        users, [{"name": "admin", "role": "admin", "team": "default", "created_at": time.time()}]
    )


def downgrade() -> None:
    """Undo :func:`upgrade` (users, tokens, sessions and the events' actors are lost)."""
    op.drop_index("ix_events_actor", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("source")
        batch.drop_column("actor")
    op.drop_index("ix_sessions_token_id", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_tokens_user_name", table_name="tokens")
    op.drop_table("tokens")
    op.drop_table("users")
