"""The store's lock (one server per store): refused at once naming the holder, released on
release, taken over once its holder is gone (a file's ``flock``, PostgreSQL's advisory lock)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.controller.postgres import Postgres
from tidal.controller.store.server_lock import (
    LOCK_FILE,
    FileLock,
    Holder,
    PostgresLock,
    StoreLock,
    StoreLocked,
    hold_store,
)


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    with hold_store(tmp_path / "data") as first:
        first.record("http://127.0.0.1:8765")
        # flock belongs to an open file: a second open in this process is refused too.
        with pytest.raises(StoreLocked) as refused:
            StoreLock(tmp_path / "data").acquire()
    assert refused.value.holder == Holder(os.getpid(), "http://127.0.0.1:8765")
    assert str(refused.value) == (
        f"another server (pid {os.getpid()}, http://127.0.0.1:8765) already serves "
        f"{tmp_path / 'data'}"
    )


def test_released_lock_is_taken_again_and_its_file_emptied(tmp_path: Path) -> None:
    with hold_store(tmp_path) as lock:
        lock.record("http://h:1")
    assert (tmp_path / LOCK_FILE).read_text() == ""
    assert (tmp_path / LOCK_FILE).stat().st_mode & 0o777 == 0o600
    with hold_store(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_dead_holders_record_does_not_hold(tmp_path: Path) -> None:
    # What a SIGKILLed server leaves: its record, no lock.
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 999_999_999, "url": "http://h:1"}))
    with hold_store(tmp_path):
        assert FileLock(tmp_path / LOCK_FILE, "x").holder() == Holder(os.getpid(), None)


def test_refused_database_lock_releases_the_data_dir(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    with hold_store(tmp_path / "one", db_url), pytest.raises(StoreLocked) as refused:
        StoreLock(tmp_path / "two", db_url).acquire()
    assert str(refused.value).endswith(f"already serves {tmp_path / 'shared.db'}")
    # "two"'s own lock was let go when the database's was refused.
    with hold_store(tmp_path / "two"):
        pass


def test_unreadable_record_still_refuses(tmp_path: Path) -> None:
    with hold_store(tmp_path):
        (tmp_path / LOCK_FILE).write_text("not json")
        with pytest.raises(StoreLocked, match=r"^another server already serves"):
            StoreLock(tmp_path).acquire()


@pytest.mark.slow
def test_lock_of_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path;"
            "from tidal.controller.store.server_lock import StoreLock;"
            "lock = StoreLock(Path(sys.argv[1])); lock.acquire(); lock.record('http://h:2');"
            "print('held', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StoreLocked) as refused:
            StoreLock(tmp_path).acquire()
        assert refused.value.holder == Holder(holder.pid, "http://h:2")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    with hold_store(tmp_path):
        pass


@pytest.mark.slow
def test_postgres_advisory_lock(postgres_server: Postgres) -> None:
    url = postgres_server.new_database()
    first = PostgresLock(url)
    first.acquire()
    try:
        first.record("http://127.0.0.1:8765")
        second = PostgresLock(url)
        with pytest.raises(StoreLocked) as refused:
            second.acquire()
        assert refused.value.holder == Holder(os.getpid(), "http://127.0.0.1:8765")
        assert str(refused.value).endswith(f"already serves {refused.value.where}")
        assert "/tidal_" in refused.value.where
    finally:
        first.release()
    second.acquire()
    # Its session ended (the server died, the connection dropped): the lock goes with it.
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'tidal server %'"
                )
            )
    finally:
        engine.dispose()
    third = PostgresLock(url)
    third.acquire()
    third.release()
    second.release()  # its connection is gone: nothing to unlock, nothing raised
