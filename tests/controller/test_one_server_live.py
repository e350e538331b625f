"""One server per store, with real ``tidal server`` processes: a second one on the same
data dir (or PostgreSQL database) is refused at once, changing nothing, while the first
serves on; once the first is SIGKILLed a new one starts on its data dir."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tests.controller.postgres import Postgres, running_postgres
from tidal.client import Client
from tidal.wire.discovery import SERVER_FILE, read_server_info, read_token

pytestmark = pytest.mark.slow

#: A job that runs until stopped.
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def second_server(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run another ``tidal server`` on ``data`` to its end (a refusal ends it at once)."""
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "server", "--slots", "2", "--data-dir", str(data),
         "--standby-workers", "0", *args],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def client(data: Path) -> Client:
    """An SDK client of the server ``data``'s record names, with the data dir's token."""
    info = read_server_info(data)
    assert info is not None
    return Client(url=info.url, token=read_token(data), timeout=5.0)


def worker_pids(sdk: Client, job: str) -> list[int]:
    """The pids of the job's live workers."""
    # A plain process (no tidal runtime) never reports ready: it stays "starting".
    live = ("starting", "running")
    return [w.pid for w in sdk.get(job).worker_list if w.state in live and w.pid]


def serves(data: Path) -> bool:
    """Whether the server that ``data``'s record names answers."""
    with client(data) as sdk:
        return sdk.health() and isinstance(sdk.list(), list)


def test_second_server_on_a_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_server(tmp_path, slots=2)
    try:
        info = read_server_info(data)
        assert info is not None and info.pid == first.pid
        # A running job: a second server must neither start it again nor stop it.
        sdk = client(data)
        job = sdk.submit({"name": "sleeper", "command": SLEEP, "workers": 1}).id
        agent = data / "agents" / f"{job}.agent.json"

        until(lambda: len(worker_pids(sdk, job)) == 1 and agent.exists(), 90, "the job's worker")
        agent_record, workers = agent.read_text(), worker_pids(sdk, job)
        record = (data / SERVER_FILE).read_bytes()
        stamp = (data / SERVER_FILE).stat().st_mtime_ns
        refused = second_server(data)
        assert refused.returncode == 1, refused.stderr
        assert (
            f"tidal: another server (pid {first.pid}, {info.url}) already serves {data}"
            in refused.stderr.splitlines()
        )
        assert "Traceback" not in refused.stderr
        assert refused.stdout == ""  # no URL, no token
        assert (data / SERVER_FILE).read_bytes() == record
        assert (data / SERVER_FILE).stat().st_mtime_ns == stamp
        assert first.poll() is None and serves(data)
        assert sdk.get(job).state == "running" and worker_pids(sdk, job) == workers
        assert agent.read_text() == agent_record
        assert sorted(p.name for p in (data / "agents").glob("*.agent.json")) == [agent.name]
        sdk.close()
    finally:
        stop_server(first)
    assert first.returncode == 0


def test_a_killed_servers_data_dir_is_taken_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_server(tmp_path, slots=2)
    with client(data) as sdk:
        job = sdk.submit({"name": "sleeper", "command": SLEEP, "workers": 1}).id
        until(lambda: bool(worker_pids(sdk, job)), 90, "the job's worker")
        workers = worker_pids(sdk, job)
    # The server alone dies: its job's agent lives on, and must not hold the lock.
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    # It left its record and its lock file: neither holds the data dir.
    assert read_server_info(data) is not None
    second = start_server(tmp_path, slots=2)
    try:
        info = read_server_info(data)
        assert info is not None and info.pid == second.pid and serves(data)
        with client(data) as sdk:  # the new server re-attached to the job's agent
            assert sdk.get(job).state == "running" and worker_pids(sdk, job) == workers
    finally:
        stop_server(second)
    assert second.returncode == 0


def test_second_server_on_a_postgres_store_is_refused(
    tmp_path: Path, postgres_server: Postgres
) -> None:
    # Two data dirs, one database: only the database's lock can refuse the second.
    db_url = postgres_server.new_database()
    first = start_server(tmp_path, "--db-url", db_url, slots=2)
    try:
        info = read_server_info(tmp_path / "data")
        assert info is not None
        refused = second_server(tmp_path / "other", "--db-url", db_url)
        assert refused.returncode == 1, refused.stderr
        database = db_url.split("/")[-1].split("?")[0]
        line = f"tidal: another server (pid {first.pid}, {info.url}) already serves "
        assert any(
            text.startswith(line) and database in text for text in refused.stderr.splitlines()
        ), refused.stderr
        assert not (tmp_path / "other" / SERVER_FILE).exists()
        assert refused.stdout == ""
        assert first.poll() is None and serves(tmp_path / "data")
    finally:
        stop_server(first)
    assert first.returncode == 0


def _lock_holder_pid(db_url: str) -> int | None:
    """The pid the server holding the store's database lock names, or ``None``."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            name = conn.execute(
                text(
                    "SELECT a.application_name FROM pg_locks l"
                    " JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted"
                )
            ).scalar()
    except Exception:  # still starting
        return None
    finally:
        engine.dispose()
    parts = str(name or "").split()
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def test_the_database_lock_is_taken_back_after_the_database_restarts(tmp_path: Path) -> None:
    # A cluster of its own: restarting the session's one would fail other tests.
    with running_postgres() as postgres:
        db_url = postgres.new_database()
        first = start_server(tmp_path, "--db-url", db_url, slots=2)
        try:
            until(lambda: _lock_holder_pid(db_url) == first.pid, 60, "the first server's lock")
            # A restart ends every session, and with the first server's its lock.
            postgres.stop()
            postgres.start()
            until(lambda: _lock_holder_pid(db_url) == first.pid, 60, "the lock taken back")
            refused = second_server(tmp_path / "other", "--db-url", db_url)
            assert refused.returncode == 1, refused.stderr
            assert "already serves" in refused.stderr
            assert first.poll() is None and serves(tmp_path / "data")
        finally:
            stop_server(first)
        assert first.returncode == 0
