"""The store's schema migrations (Alembic), run in code when a store opens.

Each change to the store's tables is a revision in ``versions/`` (``0001_baseline.py`` is the
schema of the last release before migrations). :func:`upgrade` brings any store this
release knows to the newest revision, in place, in one transaction; a store written by a
newer release, whose revision is unknown here, is refused and left untouched. No
``alembic.ini`` is needed: the config is built here. ``python -m tidal.controller.store.migrations
revision -m "..."`` writes a new revision (see ``docs/controller.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, inspect, text

__all__ = [
    "LEGACY_SCHEMA_VERSIONS",
    "StoreError",
    "config",
    "head",
    "revisions",
    "target_metadata",
    "upgrade",
]

log = logging.getLogger(__name__)

SCRIPT_LOCATION = Path(__file__).resolve().parent
#: ``schema_version`` values of stores written before migrations; revision 0001 adopts them.
LEGACY_SCHEMA_VERSIONS = frozenset({1, 2})
#: The tables of a store (a database holding any of them without a version is refused).
_STORE_TABLES = frozenset(
    {
        "schema_version",
        "jobs",
        "requests",
        "workers",
        "events",
        "allocations",
        "metrics",
        "goodput",
        "host_drains",
        "datasets",
        "dataset_versions",
        "models",
        "model_versions",
        "model_aliases",
        "model_runs",
    }
)
#: Milliseconds a migration waits for another process's migration of the same SQLite file.
_MIGRATION_WAIT_MS = 120_000

#: PostgreSQL advisory lock held while migrating, so two servers starting at once take turns.
_PG_LOCK_KEY = 0x7469_6461_6C00  # "tidal"


class StoreError(RuntimeError):
    """The store cannot be used (e.g. written by an incompatible version)."""


def target_metadata() -> MetaData:
    """The ORM models' tables: what the newest revision must produce (autogenerate's target)."""
    from tidal.controller.store.tables import TableBase  # imported late: Alembic's env imports this

    return TableBase.metadata


def config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config for the package's migrations, on ``connection`` or on ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION).replace("%", "%%"))
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(config())


def revisions() -> list[str]:
    """Every revision this release knows, oldest first."""
    return [s.revision for s in reversed(list(_scripts().walk_revisions()))]


def head() -> str:
    """The newest revision: the schema this release reads and writes."""
    heads = _scripts().get_heads()
    if len(heads) != 1:
        # Two revisions with the same parent: a merge of branches that both added one.
        raise RuntimeError(f"the migrations have {len(heads)} heads ({', '.join(heads)})")
    return heads[0]


def upgrade(engine: Engine) -> None:
    """Bring the store at ``engine`` to :func:`head`: create it, adopt a pre-migration store,
    or apply the revisions it lacks. All or nothing; refuses (:class:`StoreError`) a store
    this release cannot read, without changing it."""
    newest = head()
    with _exclusive(engine) as conn:
        tables = set(inspect(conn).get_table_names())
        if "alembic_version" in tables:
            current = MigrationContext.configure(conn).get_current_heads()
            known = set(revisions())
            unknown = [r for r in current if r not in known]
            if unknown:
                raise StoreError(
                    f"the store at {engine.url!r} is at schema revision {', '.join(unknown)}, "
                    f"which this tidal does not know (it was written by a newer release?); "
                    f"this tidal reads revisions up to {newest}"
                )
            if tuple(current) == (newest,):
                return
            log.info("upgrading the store from revision %s to %s", ", ".join(current), newest)
        elif "schema_version" in tables:
            found = sorted(conn.execute(text("SELECT version FROM schema_version")).scalars())
            if not set(found) <= LEGACY_SCHEMA_VERSIONS or len(found) > 1:
                raise StoreError(
                    f"the store at {engine.url!r} has schema version "
                    f"{', '.join(map(str, found))}; this tidal upgrades versions "
                    f"{', '.join(map(str, sorted(LEGACY_SCHEMA_VERSIONS)))}"
                )
            log.info("upgrading the store from schema version %s to revision %s", found, newest)
        elif tables & _STORE_TABLES:
            raise StoreError(
                f"the database at {engine.url!r} holds tables named like tidal's "
                f"({', '.join(sorted(tables & _STORE_TABLES))}) but no schema version"
            )
        command.upgrade(config(conn), "head")


@contextmanager
def _exclusive(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that no other migration runs beside; committed at the
    end unless the block raises."""
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            # SQLite rebuilds a table to alter it; with foreign keys enforced, dropping the
            # old copy would fail. They are checked once, before commit, instead.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            # A migration holds the write lock while Alembic loads its scripts and applies
            # every revision: seconds on a loaded machine, longer than the store's usual
            # busy timeout, and a second server starting beside it must wait, not fail.
            # The connection's own timeout is put back afterwards (it goes back to the pool).
            usual_wait_ms = int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one())
            conn.exec_driver_sql(f"PRAGMA busy_timeout={_MIGRATION_WAIT_MS}")
            try:
                # Takes the write lock now: a second process waits here (busy_timeout).
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    raise RuntimeError(f"migrating left rows without their job: {broken[:5]}")
                conn.commit()
            finally:
                conn.rollback()
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.exec_driver_sql(f"PRAGMA busy_timeout={usual_wait_ms}")
                conn.commit()
        else:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            yield conn
            conn.commit()
