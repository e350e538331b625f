"""When the store (or the data dir beside it) cannot take a write: a full disk, a read-only
file system or database, a database that cannot be reached.

:func:`outage_of` tells such an error from any other (a bug) and says what it is, so the
API answers it as a condition of the server (507 or 503, naming the cause) rather than a
500, and the controller loop waits for it to pass rather than logging it each tick.
Pure: it reads the exception, nothing else.
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass
from enum import Enum

from sqlalchemy import exc as sa_exc

__all__ = ["Outage", "OutageKind", "outage_of"]


class OutageKind(Enum):
    """What keeps the store from being written."""

    #: No space left (or the quota spent) on the disk holding the store or the data dir.
    DISK_FULL = "disk full"
    #: The file system or the database accepts no writes.
    READ_ONLY = "read-only"
    #: The database cannot be reached (down, restarting, the connection lost).
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Outage:
    """An error that is a condition of the server's resources, not of the request."""

    kind: OutageKind
    #: What the operating system or the database said.
    detail: str
    #: The file that could not be written, where the error names one.
    path: str | None = None

    def describe(self, location: str) -> str:
        """The cause in a line: what failed, where (the file the error names, else
        ``location``: the store's file or database), and what was said."""
        where = self.path or location
        if self.kind is OutageKind.DISK_FULL:
            return f"disk full: no space left on the disk holding {where} ({self.detail})"
        if self.kind is OutageKind.READ_ONLY:
            return f"store read-only: {where} accepts no writes ({self.detail})"
        return f"store unavailable: {where} cannot be reached ({self.detail})"


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# SQLite's primary result codes (the low byte of an extended one).
_SQLITE_BUSY, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 5, 8, 10, 13, 14
# PostgreSQL's SQLSTATE classes: 08 connection exception, 53 insufficient resources
# (53100 disk full), 57P01-57P03 the server shutting down or starting, 25006 read-only.
_PG_DISK_FULL = "53100"
_PG_READ_ONLY = "25006"
_PG_UNAVAILABLE_CLASSES = ("08", "57P")
#: How many causes deep an error is looked into (raise ... from ...).
_DEPTH = 8


def outage_of(error: BaseException) -> Outage | None:
    """The outage ``error`` (or an error it was raised from) reports; ``None`` for any
    other error."""
    seen: BaseException | None = error
    for _ in range(_DEPTH):
        if seen is None:
            return None
        found = _direct(seen)
        if found is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    return None


def _direct(error: BaseException) -> Outage | None:
    if isinstance(error, sa_exc.DBAPIError):
        found = _database(error.orig) if error.orig is not None else None
        if found is not None:
            return found
        if isinstance(error.orig, sqlite3.Error):
            return None  # "no such table" is an OperationalError too: a bug, not an outage
        if error.connection_invalidated or isinstance(error, sa_exc.OperationalError):
            # A server database's OperationalError: the database, not the statement, failed
            # (the connection refused or lost).
            return Outage(OutageKind.UNAVAILABLE, _first_line(error.orig or error))
        return None
    if isinstance(error, sa_exc.TimeoutError):  # no connection freed in the pool's time
        return Outage(OutageKind.UNAVAILABLE, _first_line(error))
    if isinstance(error, sa_exc.DisconnectionError):
        return Outage(OutageKind.UNAVAILABLE, _first_line(error))
    if isinstance(error, sqlite3.Error):
        return _database(error)
    if isinstance(error, OSError):
        path = None if error.filename is None else str(error.filename)
        detail = error.strerror or str(error)
        if error.errno in _DISK_FULL_ERRNOS:
            return Outage(OutageKind.DISK_FULL, detail, path)
        if error.errno == errno.EROFS:
            return Outage(OutageKind.READ_ONLY, detail, path)
    return None


def _database(error: BaseException) -> Outage | None:
    """An outage a database driver's own error reports."""
    detail = _first_line(error)
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary == _SQLITE_FULL or "database or disk is full" in detail:
            return Outage(OutageKind.DISK_FULL, detail)
        if primary == _SQLITE_READONLY or "readonly database" in detail:
            return Outage(OutageKind.READ_ONLY, detail)
        if primary in (_SQLITE_BUSY, _SQLITE_IOERR, _SQLITE_CANTOPEN) or "disk I/O error" in detail:
            return Outage(OutageKind.UNAVAILABLE, detail)
        return None
    state = getattr(error, "sqlstate", None)
    if not isinstance(state, str):
        return None
    if state == _PG_DISK_FULL:
        return Outage(OutageKind.DISK_FULL, detail)
    if state == _PG_READ_ONLY:
        return Outage(OutageKind.READ_ONLY, detail)
    if state.startswith(_PG_UNAVAILABLE_CLASSES):
        return Outage(OutageKind.UNAVAILABLE, detail)
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
