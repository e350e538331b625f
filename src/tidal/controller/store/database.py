"""The store's database: its engine, opened with its schema up to date, one transaction a
call, and the change numbers that follow commit order.

SQLAlchemy 2 over any database URL; a SQLite file (WAL mode) by default. The tables are in
:mod:`~tidal.controller.store.tables`, their migrations in
:mod:`~tidal.controller.store.migrations`; what is stored in them, in
:mod:`~tidal.controller.store.jobs` and :mod:`~tidal.controller.store.history`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, bindparam, create_engine, event, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tidal.controller.store.tables import JobRow

__all__ = [
    "SCHEMA_VERSION",
    "SQLITE_BUSY_TIMEOUT_MS",
    "Database",
    "make_engine",
    "number_change",
    "number_changes",
    "private_sqlite_url",
]

#: What this release writes into the ``schema_version`` table of releases before migrations
#: (they read 1 or 2 and refuse any other number). The Alembic revision in
#: ``alembic_version`` describes the schema (:mod:`tidal.controller.store.migrations`).
SCHEMA_VERSION = 3

#: Milliseconds a SQLite connection of the store waits for a lock another one holds.
SQLITE_BUSY_TIMEOUT_MS = 5000

#: Connections a SQLite store keeps open: more than the threads that read at once (the
#: API's, the loop's, the agents' reports).
SQLITE_POOL_SIZE = 16

#: PostgreSQL advisory lock held while a change is numbered, so numbers follow commits.
_CHANGE_LOCK_KEY = 0x7469_6461_6C01


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    # WAL lets the API read while the controller loop writes. Switching a new file to WAL
    # answers "locked" at once, without the busy timeout, while another connection (a
    # second server starting beside this one) holds a lock on it: retry, bounded.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine on ``url``; a SQLite one in WAL mode, with foreign keys enforced and
    :data:`SQLITE_BUSY_TIMEOUT_MS` to wait for another connection's lock."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    if url in ("sqlite://", "sqlite:///:memory:"):
        # One shared connection, or every thread would see its own empty database.
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
    else:
        # Enough connections, kept open: a thread waiting for a free connection, or
        # opening one (and setting its pragmas) per request, queued requests under load.
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 5},
            pool_size=SQLITE_POOL_SIZE,
            max_overflow=SQLITE_POOL_SIZE,
        )
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def private_sqlite_url(data_dir: Path) -> str:
    """The URL of the SQLite file ``tidal.db`` in ``data_dir``, both made first if missing.

    The data dir is made private (0700, when this user owns it) and the database file
    0600: they hold every job's command, environment and the admin token.
    """
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if data_dir.stat().st_uid == os.getuid():
        data_dir.chmod(0o700)
    path = data_dir / "tidal.db"
    # Created here with its mode: SQLite gives the -wal and -shm files the same one.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    path.chmod(0o600)
    return f"sqlite:///{path}"


#: Run on a connection (Core): one job's change number (``number``) by ``job_id``.
_SET_CHANGE = (
    update(JobRow).where(JobRow.id == bindparam("job_id")).values(change=bindparam("number"))
)


def _hold_numbering(session: Session) -> None:
    """Write what the session holds and make this transaction the one that numbers
    changes until it commits (SQLite's write lock is held from the first write)."""
    session.flush()
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CHANGE_LOCK_KEY})


def number_change(session: Session, job_id: str) -> None:
    """Give the job's latest change the store's next change number (``jobs.change``).

    Called after the transaction's first write: SQLite holds its one write lock from there
    to the commit (PostgreSQL takes an advisory lock), so numbers are given in commit
    order and a reader that saw change N has seen every change numbered below it."""
    _hold_numbering(session)
    following = select(func.coalesce(func.max(JobRow.change), 0) + 1).scalar_subquery()
    session.execute(
        update(JobRow).where(JobRow.id == job_id).values(change=following),
        execution_options={"synchronize_session": False},
    )


def number_changes(session: Session, job_ids: Sequence[str]) -> None:
    """:func:`number_change` for several jobs written in one transaction, numbered in
    the order given (one read of the latest number, one update)."""
    if len(job_ids) == 1:
        number_change(session, job_ids[0])
        return
    _hold_numbering(session)
    latest = int(session.scalar(select(func.coalesce(func.max(JobRow.change), 0))) or 0)
    # One executemany, without the ORM (its bulk update by primary key costs more).
    session.connection().execute(
        _SET_CHANGE,
        [{"job_id": job_id, "number": latest + n} for n, job_id in enumerate(job_ids, 1)],
    )


class Database:
    """The store's database at ``url``, its schema brought to the newest revision on
    opening (:class:`~tidal.controller.store.migrations.StoreError` if this release cannot read
    it). Safe to share between threads."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite lets one connection write at a time and makes the others wait by polling
        # with growing sleeps (up to 100 ms each); this process's writers queue here
        # instead, each taking a connection only when its turn comes. Another process's
        # writer still waits through SQLite's busy timeout.
        self._writer: threading.Lock | None = (
            threading.Lock() if self.engine.dialect.name == "sqlite" else None
        )
        self._snapshots = threading.local()
        self._create_schema()

    def _create_schema(self) -> None:
        # Imported here: Alembic loads only where a store is opened.
        from tidal.controller.store import migrations

        try:
            migrations.upgrade(self.engine)
        except BaseException:
            self.engine.dispose()
            raise

    @property
    def location(self) -> str:
        """Where the store is, for messages: a SQLite file's path, else the database's URL
        without its password."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite":
            return url.database or ":memory:"
        return url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Release database connections."""
        self.engine.dispose()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads in the block (this thread's) share one transaction: one consistent view
        of the store, one connection taken and one transaction begun instead of one per
        call. A write inside it raises :class:`RuntimeError`."""
        if getattr(self._snapshots, "session", None) is not None:
            yield
            return
        with self._sessions() as session, session.begin():
            # One view for every read. PostgreSQL's default (read committed) lets each
            # statement see later commits; Python's sqlite3 begins a transaction only
            # before a write, so each read alone would see the latest commit too.
            if self.engine.dialect.name == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            elif not isinstance(self.engine.pool, StaticPool):  # one connection shared: no
                # Straight to the driver: a text() statement is compiled and looked up in
                # the statement cache first (a third of an empty snapshot's time).
                session.connection().exec_driver_sql("BEGIN")
            self._snapshots.session = session
            try:
                yield
            finally:
                self._snapshots.session = None

    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[Session]:
        """A session in a transaction: committed when the block ends, rolled back if it
        raises (every public call of the store is one). ``write`` for one that writes.
        Inside :meth:`snapshot`, the snapshot's session."""
        shared: Session | None = getattr(self._snapshots, "session", None)
        if shared is not None:
            if write:
                raise RuntimeError("the store was written inside a snapshot (reads only)")
            yield shared
            return
        if write and self._writer is not None:
            with self._writer, self._sessions() as session, session.begin():
                yield session
        else:
            with self._sessions() as session, session.begin():
                yield session
