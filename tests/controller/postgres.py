"""A private PostgreSQL server for the store tests: Debian's ``postgresql`` binaries, a
temporary cluster on a free port with its socket in its own folder (no TCP), stopped by pid.

PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` user
and its programs run through ``runuser``. Where PostgreSQL is not installed the tests that
need it are skipped with the reason, except in CI (``CI`` set), where that is a failure:
``make test`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.processes import running


@dataclass(frozen=True)
class Postgres:
    """A running server: where its socket is and how to reach a database on it."""

    socket_dir: Path
    port: int
    user: str
    #: Its cluster's folder, and how to run its programs (``pg_ctl``): to stop and start it.
    data_dir: Path | None = None
    bin_dir: Path | None = None
    prefix: tuple[str, ...] = ()

    def stop(self) -> None:
        """Stop the server (fast: open sessions are ended), its cluster kept."""
        self._ctl("stop", "-m", "fast")

    def start(self) -> None:
        """Start the stopped server again on the same port and socket."""
        self._ctl("start", "-l", str(self._log()), "-o", self._options())

    def _log(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir.parent / "server.log"

    def _options(self) -> str:
        return f"-p {self.port} -k {self.socket_dir} -c listen_addresses='' -c fsync=off"

    def _ctl(self, *args: str) -> None:
        assert self.data_dir is not None and self.bin_dir is not None, "not a private cluster"
        subprocess.run(
            [*self.prefix, str(self.bin_dir / "pg_ctl"), *args, "-w", "-t", "60",
             "-D", str(self.data_dir)],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` over the unix socket."""
        return (
            f"postgresql+psycopg://{self.user}@/{database}?host={self.socket_dir}&port={self.port}"
        )

    def new_database(self) -> str:
        """A new empty database; its URL."""
        name = f"tidal_{secrets.token_hex(4)}"
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)


def _bin_dir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    return found[-1].parent if found else None


def _unavailable(reason: str) -> None:
    message = f"PostgreSQL unavailable: {reason} (`make postgres` installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def running_postgres() -> Iterator[Postgres]:
    """Start a throw-away cluster; stop it (by its postmaster's pid) and delete it after."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable("no initdb under /usr/lib/postgresql/*/bin")
        raise AssertionError  # unreachable: skip or fail raised
    as_root = os.geteuid() == 0
    if as_root:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("no 'postgres' user to run the server as (it refuses root)")
            raise AssertionError from None
        prefix = ["runuser", "-u", "postgres", "--"]
        user = "postgres"
    else:
        owner = pwd.getpwuid(os.geteuid())
        prefix = []
        user = owner.pw_name
    root = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
    data, sockets = root / "data", root / "socket"
    sockets.mkdir()
    os.chown(root, owner.pw_uid, owner.pw_gid)
    os.chown(sockets, owner.pw_uid, owner.pw_gid)
    port = _free_port()
    pid: int | None = None
    pid_file = data / "postmaster.pid"
    try:
        subprocess.run(
            [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", user,
             "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        started = subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(data),
             "-l", str(root / "server.log"),
             "-o", f"-p {port} -k {sockets} -c listen_addresses='' -c fsync=off"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
        if started.returncode != 0:
            log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
            _unavailable(f"pg_ctl start failed: {started.stderr.strip()} {log[-500:]}")
        yield Postgres(sockets, port, user, data, bin_dir, tuple(prefix))
    finally:
        if pid_file.exists():  # started again by a test: another pid
            with contextlib.suppress(ValueError, OSError):
                pid = int(pid_file.read_text().split()[0])
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                # "Immediate" shutdown: no final checkpoint, the cluster is deleted anyway.
                os.kill(pid, signal.SIGQUIT)
            if not _wait_for_exit(pid, 30):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_for_exit(pid, 10)
        shutil.rmtree(root, ignore_errors=True)
