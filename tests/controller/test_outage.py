"""Which errors are outages of the store: real errors from SQLite, PostgreSQL's driver and
the operating system, each told from a bug."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import OperationalError

from tidal.controller.store.outage import Outage, OutageKind, outage_of


def _error(action: object) -> BaseException:
    try:
        action()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("no error raised")


def test_a_full_sqlite_database_is_a_full_disk(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'full.db'}")
    # SQLite's own ceiling on the file's size: the same SQLITE_FULL a full disk gives.
    event.listen(engine, "connect", lambda c, _: c.execute("PRAGMA max_page_count=8"))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x TEXT)"))

    def fill() -> None:
        with engine.begin() as conn:
            for _ in range(100):
                conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": "y" * 4000})

    error = _error(fill)
    engine.dispose()
    assert isinstance(error, OperationalError)
    outage = outage_of(error)
    assert outage is not None and outage.kind is OutageKind.DISK_FULL, outage
    assert outage.describe("/d/tidal.db") == (
        "disk full: no space left on the disk holding /d/tidal.db (database or disk is full)"
    )


def test_a_read_only_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with create_engine(f"sqlite:///{path}").begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")

    def write() -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))

    outage = outage_of(_error(write))
    engine.dispose()
    assert outage is not None and outage.kind is OutageKind.READ_ONLY, outage


def test_an_unreachable_postgresql_is_unavailable() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = create_engine(f"postgresql+psycopg://u@127.0.0.1:{port}/db?connect_timeout=5")
    outage = outage_of(_error(engine.connect))
    engine.dispose()
    assert outage is not None and outage.kind is OutageKind.UNAVAILABLE, outage


def test_writing_to_a_full_device_is_a_full_disk() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        outage = outage_of(_error(lambda: os.write(fd, b"x")))
    finally:
        os.close(fd)
    assert outage == Outage(OutageKind.DISK_FULL, "No space left on device")
    assert outage.describe("/d/tidal.db").startswith("disk full: no space left on the disk")


def test_a_read_only_file_system_and_a_wrapped_cause() -> None:
    read_only = OSError(errno.EROFS, "Read-only file system", "/d/server.json")
    try:
        try:
            raise read_only
        except OSError as exc:
            raise RuntimeError("could not write the launch file") from exc
    except RuntimeError as wrapped:
        outage = outage_of(wrapped)
    assert outage == Outage(OutageKind.READ_ONLY, "Read-only file system", "/d/server.json")
    assert outage.describe("/d/tidal.db").startswith("store read-only: /d/server.json ")


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("a bug"),
        KeyError("x"),
        OSError(errno.ENOENT, "No such file or directory", "/d/x"),
        OSError(errno.EACCES, "Permission denied", "/d/x"),
    ],
    ids=repr,
)
def test_other_errors_are_not_outages(error: BaseException) -> None:
    assert outage_of(error) is None


def test_a_statement_error_is_a_bug_not_an_outage(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")

    def missing() -> None:
        with engine.begin() as conn:
            conn.execute(text("SELECT * FROM no_such_table"))

    error = _error(missing)
    engine.dispose()
    assert isinstance(error, OperationalError)  # SQLite says "OperationalError" for it too
    assert outage_of(error) is None
