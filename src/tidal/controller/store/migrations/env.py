"""Alembic's entry point for the store's migrations.

tidal hands over an open connection (``config.attributes["connection"]``, see
:func:`tidal.controller.store.migrations.upgrade`); ``alembic`` commands run from a config with a
``sqlalchemy.url`` get an engine of their own.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from tidal.controller.store.migrations import target_metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata(),
        # SQLite alters most columns only by copying the table: batch mode does that.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("tidal's migrations run on a live database only (no --sql)")
_connection = context.config.attributes.get("connection")
if _connection is not None:
    _run(_connection)
else:
    _url = context.config.get_main_option("sqlalchemy.url")
    if not _url:
        raise SystemExit("set sqlalchemy.url (alembic -x or a config) to run migrations")
    with create_engine(_url).begin() as _own:
        _run(_own)
