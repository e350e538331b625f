"""One server per store: the exclusive lock a server holds on its store for its lifetime.

Two servers on one store would both run the loop: a job started twice, each one's
``server.json`` over the other's. So a server first takes

* the **data dir's lock**: ``server.lock`` held with ``flock`` (it guards ``server.json``,
  the agents' records and the default SQLite store in that folder);
* for a ``--db-url`` store, the **database's lock** as well: a session-level advisory lock
  (``pg_try_advisory_lock``) on a connection of its own for PostgreSQL, a ``flock`` on
  ``<file>.lock`` beside a SQLite file.

Neither waits: a held lock refuses at once (:class:`StoreLocked`), naming the holder's pid
and URL. The operating system drops both when their process dies (the file's descriptor
closes, PostgreSQL ends the session), so a lock left by a killed server is taken over
without anyone cleaning up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "LOCK_FILE",
    "FileLock",
    "Holder",
    "PostgresLock",
    "StoreLock",
    "StoreLocked",
    "hold_store",
]

log = logging.getLogger(__name__)

#: The data dir's lock file: held while a server runs; names its pid and URL.
LOCK_FILE = "server.lock"

#: PostgreSQL advisory lock of the store's one server ("tidal" and 2; 1 numbers changes).
SERVER_LOCK_KEY = 0x7469_6461_6C02

#: How a server names itself in ``application_name`` (a second server reads it there).
_APP_PREFIX = "tidal server"


@dataclass(frozen=True)
class Holder:
    """The server that holds a lock, as far as its record says."""

    pid: int | None = None
    url: str | None = None

    def describe(self) -> str:
        """``another server (pid 1234, http://...)``, with what is known."""
        known = [f"pid {self.pid}" if self.pid is not None else "", self.url or ""]
        shown = ", ".join(part for part in known if part)
        return f"another server ({shown})" if shown else "another server"


class StoreLocked(RuntimeError):
    """The store is held by another server: this one must not start."""

    def __init__(self, where: str, holder: Holder) -> None:
        self.where = where
        self.holder = holder
        super().__init__(f"{holder.describe()} already serves {where}")


class Lock(Protocol):
    """One exclusive, non-blocking lock a server holds."""

    def acquire(self) -> None:
        """Take it, or raise :class:`StoreLocked`."""

    def record(self, url: str) -> None:
        """Name this server's URL where a refused server will read it."""

    def keep(self) -> Holder | None:
        """Make sure it is still held, taking it again if it was lost; the server that
        holds it instead, or ``None``."""

    def release(self) -> None:
        """Let it go (idempotent)."""


class FileLock:
    """``flock`` on a file whose content names the holder (JSON: pid, url)."""

    def __init__(self, path: Path, where: str) -> None:
        self.path = path
        self.where = where
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; :class:`StoreLocked` names the holder."""
        import fcntl

        # Not inherited (Python's default): an agent outliving the server must not hold it.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLocked(self.where, self.holder()) from None
        except BaseException:
            os.close(fd)
            raise
        previous = self.holder()
        if previous.pid is not None and previous.pid != os.getpid():
            log.info("took over %s from pid %d, which is gone", self.path, previous.pid)
        self._fd = fd
        self._write(None)

    def holder(self) -> Holder:
        """Who the file names (nothing if it is empty or unreadable)."""
        try:
            data = json.loads(self.path.read_text())
            pid, url = data.get("pid"), data.get("url")
            return Holder(int(pid) if pid is not None else None, str(url) if url else None)
        except (OSError, ValueError, TypeError, AttributeError):
            return Holder()

    def record(self, url: str) -> None:
        """Add the URL to the file (the pid is there since :meth:`acquire`)."""
        self._write(url)

    def _write(self, url: str | None) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({"pid": os.getpid(), "url": url}).encode() + b"\n", 0)

    def keep(self) -> Holder | None:
        """A ``flock`` lasts as long as its descriptor: never lost."""
        return None

    def release(self) -> None:
        """Empty the file and unlock it. The file stays: removing it would let a server
        that opened it just before lock a file no later server sees."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the descriptor drops the flock


class PostgresLock:
    """A session-level advisory lock on a connection kept open while the server runs.

    The holder names itself in the connection's ``application_name``
    (``tidal server PID URL``), which a refused server reads from ``pg_stat_activity``.
    """

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url
        from sqlalchemy.pool import NullPool

        self.where = make_url(url).render_as_string(hide_password=True)
        # Autocommit: the connection sits idle, not inside a transaction, for days.
        self._engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self._conn: Any = None
        self._url: str | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; :class:`StoreLocked` names the holder."""
        from sqlalchemy import text

        conn = self._engine.connect()
        try:
            taken = conn.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": SERVER_LOCK_KEY}
            ).scalar()
            if not taken:
                raise StoreLocked(self.where, self._holder(conn))
        except BaseException:
            conn.close()
            self._engine.dispose()
            raise
        self._conn = conn
        self._name(None)

    def _holder(self, conn: Any) -> Holder:
        from sqlalchemy import text

        # A bigint key is stored as its high (classid) and low (objid) 32 bits.
        name = conn.execute(
            text(
                "SELECT a.application_name FROM pg_locks l"
                " JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                " AND l.database = (SELECT oid FROM pg_database"
                "   WHERE datname = current_database())"
                " AND l.classid::bigint = :high AND l.objid::bigint = :low"
            ),
            {"high": SERVER_LOCK_KEY >> 32, "low": SERVER_LOCK_KEY & 0xFFFF_FFFF},
        ).scalar()
        return _parse_name(name)

    def record(self, url: str) -> None:
        """Name the URL in this connection's ``application_name``."""
        self._url = url
        self._name(url)

    def keep(self) -> Holder | None:
        """A session lock lives as long as its connection: a database restart drops both,
        and another server could then take the store. Check the connection; when it is
        gone, connect again and take the lock again. Returns the server that took it
        meanwhile; ``None`` when it is held again, or while the database cannot be
        reached (then no server can write to it either)."""
        from sqlalchemy import text

        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                return None
            except Exception:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
        try:
            conn = self._engine.connect()
        except Exception:
            return None  # unreachable: try again at the next look
        try:
            taken = conn.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": SERVER_LOCK_KEY}
            ).scalar()
            holder = None if taken else self._holder(conn)
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            return None
        if holder is not None:
            conn.close()
            return holder
        self._conn = conn
        self._name(self._url)
        log.warning(
            "store lock on %s taken again: the database connection had been lost", self.where
        )
        return None

    def _name(self, url: str | None) -> None:
        from sqlalchemy import text

        if self._conn is None:
            return
        name = f"{_APP_PREFIX} {os.getpid()}" + (f" {url}" if url else "")
        # Best effort: PostgreSQL truncates it at 63 bytes, and it only helps the message.
        with contextlib.suppress(Exception):
            self._conn.execute(
                text("SELECT set_config('application_name', :n, false)"), {"n": name}
            )

    def release(self) -> None:
        """Unlock and close the connection (idempotent)."""
        from sqlalchemy import text

        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                # A lost connection has lost its lock already.
                with contextlib.suppress(Exception):
                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SERVER_LOCK_KEY})
            finally:
                with contextlib.suppress(Exception):
                    conn.close()
        self._engine.dispose()


def _parse_name(name: object) -> Holder:
    """The holder from ``tidal server PID [URL]`` (nothing if it is not one)."""
    if not isinstance(name, str) or not name.startswith(_APP_PREFIX + " "):
        return Holder()
    pid, _, url = name[len(_APP_PREFIX) + 1 :].partition(" ")
    return Holder(int(pid) if pid.isdigit() else None, url or None)


def database_lock(db_url: str) -> Lock | None:
    """The lock of a ``--db-url`` store: advisory for PostgreSQL, a file beside a SQLite
    file; ``None`` (with a warning) where this release has none."""
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":
        return PostgresLock(db_url)
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:":
            return None  # private to this process
        path = Path(url.database).expanduser().resolve()
        return FileLock(path.with_name(path.name + ".lock"), str(path))
    log.warning("no lock guards a %s store: run one server on it", url.get_backend_name())
    return None


class StoreLock:
    """The locks of a server's store, taken in order and released in reverse."""

    def __init__(self, data_dir: Path, db_url: str | None = None) -> None:
        self.locks: list[Lock] = [FileLock(data_dir / LOCK_FILE, str(data_dir))]
        self._data_dir = data_dir
        if db_url is not None:
            extra = database_lock(db_url)
            if extra is not None:
                self.locks.append(extra)
        self._held: list[Lock] = []

    def acquire(self) -> None:
        """Take every lock, or none: :class:`StoreLocked` after releasing those taken."""
        # Made here as the store would make it (private): its lock file lives in it.
        self._data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            for lock in self.locks:
                lock.acquire()
                self._held.append(lock)
        except BaseException:
            self.release()
            raise

    def record(self, url: str) -> None:
        """Name this server's URL in every lock it holds."""
        for lock in self._held:
            lock.record(url)

    def keep(self) -> Holder | None:
        """Check every lock held (taking back one that was lost); the server that holds
        one instead, or ``None`` while this server holds them all."""
        for lock in self._held:
            holder = lock.keep()
            if holder is not None:
                return holder
        return None

    def release(self) -> None:
        """Release what is held, last taken first."""
        while self._held:
            self._held.pop().release()


@contextlib.contextmanager
def hold_store(data_dir: Path, db_url: str | None = None) -> Iterator[StoreLock]:
    """Hold the store of ``data_dir`` (and ``db_url``) for the ``with`` block, or raise
    :class:`StoreLocked` before anything is changed."""
    lock = StoreLock(data_dir, db_url)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
