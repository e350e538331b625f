"""The local backend's standby agent: a new job's agent is the standby, its first workers
the standby's warm interpreters; nothing of a standby outlives its backend or server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backends.conformance import SCRIPT, assert_no_process, python_children
from tidal.backends.local import LocalBackend
from tidal.launch.agent import ENV_AGENT_TREE
from tidal.launch.api import JobLaunch, JobStatus, WorkerState
from tidal.launch.process import marked_pids

pytestmark = pytest.mark.slow

#: How long a wait may take on a loaded host (each is event-driven, by polling).
WAIT_S = 180.0


def _tree_of(pid: int) -> str:
    """The agent tree token in process ``pid``'s environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    prefix = f"{ENV_AGENT_TREE}=".encode()
    return next(v[len(prefix) :].decode() for v in environ if v.startswith(prefix))


def _until(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _job(tmp_path: Path, job_id: str, epochs: int, step_delay: float = 0.0) -> JobLaunch:
    out = tmp_path / job_id
    out.mkdir(exist_ok=True)
    return JobLaunch(
        job_id=job_id,
        argv=(
            *(sys.executable, str(SCRIPT), "--out", str(out)),
            *("--epochs", str(epochs), "--step-delay", str(step_delay)),
        ),
        log_dir=tmp_path / job_id / "logs",
        checkpoint_dir=tmp_path / job_id / "ckpt",
        gpu=False,
    )


def _standby_pool(polls: Polls, size: int, *, not_pid: int = 0) -> tuple[int, set[int]]:
    """The pid of a standby (other than ``not_pid``) and its warm interpreters, once all
    ``size`` started."""

    def started() -> bool:
        polls.poll()
        process = polls.backend._standby.process
        return process is not None and process.pid != not_pid

    _until("a standby", started)
    process = polls.backend._standby.process
    assert process is not None
    _until(
        f"the standby's {size} interpreters",
        lambda: len(python_children(process.pid, b"tidal.launch.warm")) == size,
    )
    return process.pid, python_children(process.pid, b"tidal.launch.warm")


class Polls:
    """Polls a backend, keeping each job's last status (a job over is reported once)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.last: dict[str, JobStatus] = {}

    def poll(self) -> None:
        """One poll of the backend."""
        self.last.update(self.backend.poll())

    def until(self, job_id: str, what: str, check: Callable[[JobStatus], bool]) -> JobStatus:
        """Poll until ``check`` holds for the job's last status."""

        def look() -> bool:
            self.poll()
            return job_id in self.last and check(self.last[job_id])

        try:
            _until(what, look)
        except AssertionError:
            raise AssertionError(f"{what}; last status: {self.last.get(job_id)}") from None
        return self.last[job_id]


def _trains(status: JobStatus) -> bool:
    """A worker trains, or trained already (a short job may end between two polls)."""
    return status.finished or any(w.state is WorkerState.RUNNING for w in status.workers)


def _trains_recorded(
    agents: Path, job_id: str, records: dict[str, dict[str, object]]
) -> Callable[[JobStatus], bool]:
    """:func:`_trains`, keeping the job's agent record whenever a look finds it: the record
    is removed when the job ends, which on a loaded host can come before the look that
    first sees it train."""

    def check(status: JobStatus) -> bool:
        # Not written yet, or gone with the job's end: the last one read stays.
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            records[job_id] = json.loads((agents / f"{job_id}.agent.json").read_text())
        return _trains(status)

    return check


def test_a_new_job_starts_in_the_standby_and_its_pool(tmp_path: Path) -> None:
    """The job's agent is the standby, its two workers two of the standby's warm
    interpreters; once it trains a new standby is started, which the next job takes; both
    jobs train to the end."""
    data = tmp_path / "data"
    backend = LocalBackend(data, standby_workers=2)
    polls = Polls(backend)
    seen: set[int] = set()
    try:
        standby, pool = _standby_pool(polls, 2)
        seen |= pool | {standby}
        # Both jobs slowed (seconds of training), so each is still running, its agent's
        # record there, when it is first seen training.
        first = _job(tmp_path, "first", epochs=2, step_delay=0.1)
        backend.start(first, [("local", 0), ("local", 1)])
        records: dict[str, dict[str, object]] = {}
        agents = data / "agents"
        status = polls.until(
            "first", "the first job training", _trains_recorded(agents, "first", records)
        )
        assert records["first"]["pid"] == standby, records
        workers = {w.pid for w in status.workers if w.pid is not None}
        assert workers and workers <= pool, f"cold workers: {workers} not in {pool}"

        second, second_pool = _standby_pool(polls, 2, not_pid=standby)
        seen |= second_pool | {second}
        # The next standby's pool imports ahead what the first job's script imported.
        for pid in second_pool:
            assert b"sklearn.datasets" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        backend.start(_job(tmp_path, "second", epochs=1, step_delay=0.1), [("local", 2)])
        polls.until(
            "second", "the second job training", _trains_recorded(agents, "second", records)
        )
        assert records["second"]["pid"] == second, records

        for job_id in ("first", "second"):
            polls.until(job_id, f"{job_id} to finish", lambda s: s.finished)
        assert "standby agent" in (data / "agents" / "first.agent.log").read_text()
    finally:
        backend.close()
    assert_no_process(seen)


def test_close_leaves_nothing_of_the_standby(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "data", standby_workers=2)
    try:
        standby, pool = _standby_pool(Polls(backend), 2)
        tree = _tree_of(standby)
        assert set(marked_pids(tree, variable=ENV_AGENT_TREE)) >= pool | {standby}
    finally:
        backend.close()
    # SIGKILLed by close(); a killed process is listed until the kernel has ended it.
    _until("the standby's processes to end", lambda: not marked_pids(tree, variable=ENV_AGENT_TREE))


def test_a_standby_that_died_is_replaced_and_a_job_still_starts(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "data", standby_workers=1)
    polls = Polls(backend)
    try:
        standby, _ = _standby_pool(polls, 1)
        os.kill(standby, signal.SIGKILL)
        replaced, _ = _standby_pool(polls, 1, not_pid=standby)
        os.kill(replaced, signal.SIGKILL)
        # Handed to a dead standby: the job's agent is spawned instead.
        backend.start(_job(tmp_path, "after", epochs=1), [("local", 0)])
        polls.until("after", "the job to finish", lambda s: s.finished)
    finally:
        backend.close()


def test_a_killed_server_leaves_no_standby(tmp_path: Path) -> None:
    """The server is SIGKILLed: its standby and the standby's pool end on their own
    (their stdin closed), within a bounded wait."""
    data = tmp_path / "data"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "tidal.cli", "server", "--slots", "2"),
            *("--data-dir", str(data), "--standby-workers", "1"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "a"),  # noqa: SIM115
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, TIDAL_HOME=str(tmp_path / "home")),
    )
    try:
        _until("the server's standby", lambda: python_children(server.pid, b"tidal.launch.standby"))
        (standby,) = python_children(server.pid, b"tidal.launch.standby")
        tree = _tree_of(standby)
        _until("the standby's pool", lambda: python_children(standby, b"tidal.launch.warm"))
    finally:
        server.kill()
        server.wait(timeout=30)
    _until("the standby to end", lambda: marked_pids(tree, variable=ENV_AGENT_TREE) == [])
