"""The local backend (per-job agents and their worker subprocesses) passes the backend
conformance suite, re-attaching to its agents included."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.conformance import BackendConformance, Harness
from tests.tmpfs import fill, mounted_tmpfs
from tidal.backends.local import LocalBackend
from tidal.launch.api import JobLaunch, WorkerState

pytestmark = pytest.mark.slow


class TestLocalConformance(BackendConformance):
    """Every case of the suite, on this machine's slots."""

    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        """Local backends, closed (jobs stopped, agents ended) after the test."""
        made = Harness(
            make=lambda data: LocalBackend(data),
            slots=(("local", 0), ("local", 1), ("local", 2)),
            wide=(("local", 0), ("local", 1), ("local", 2), ("local", 3)),
        )
        yield made
        made.close()


#: A worker that does nothing until it is stopped.
SLEEP = "import time; time.sleep(600)"


def _plain(job_id: str, code: str, tmp_path: Path) -> JobLaunch:
    """A job whose workers run ``python -c code`` (no tidal runtime)."""
    return JobLaunch(
        job_id=job_id,
        argv=(sys.executable, "-c", code),
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "ckpt",
        gpu=False,
    )


def _serving(backend: LocalBackend, job_id: str) -> None:
    """Poll until the job's agent serves its store (``start`` does not wait for it)."""
    deadline = time.monotonic() + 120
    while (agent := backend._agents[job_id]).boot is not None or agent.store is None:
        assert time.monotonic() < deadline, f"the agent of {job_id} did not serve"
        backend.poll()
        time.sleep(0.05)


def test_a_job_that_ended_while_no_controller_watched_is_reported_ended(
    tmp_path: Path,
) -> None:
    """The controller was down while the job's workers finished: the next backend on the
    data dir reports the job finished (once), not gone, so it is not run again."""
    data = tmp_path / "data"
    first = LocalBackend(data)
    first.start(
        _plain("quick", "pass", tmp_path),
        [("local", 0)],
    )
    # No poll: this backend is the controller that was SIGKILLed.
    final = data / "agents" / "quick.final.json"
    deadline = time.monotonic() + 120
    while not (final.exists() and not (data / "agents" / "quick.agent.json").exists()):
        assert time.monotonic() < deadline, "the agent did not end"
        time.sleep(0.05)
    again = LocalBackend(data)
    try:
        status = again.poll().get("quick")
        assert status is not None, "the ended job was taken for lost"
        assert status.finished and not status.failed
        assert [w.state for w in status.workers] == [WorkerState.EXITED]
        assert "quick" not in again.poll(), "reported once"
    finally:
        again.close()
        first.close()


def test_an_agent_killed_mid_job_is_replaced_at_once(tmp_path: Path) -> None:
    """A SIGKILLed agent leaves its record behind: the new agent is connected to, not the
    dead one's store (which once stalled the restart, and the controller's tick, for
    attempts of 10 s each before it failed)."""
    data = tmp_path / "data"
    backend = LocalBackend(data)
    record = data / "agents" / "killed.agent.json"
    try:
        backend.start(
            _plain("killed", SLEEP, tmp_path),
            [("local", 0)],
        )
        _serving(backend, "killed")
        dead_pid = int(json.loads(record.read_text())["pid"])
        os.kill(dead_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (status := backend.poll().get("killed")) is None or status.reason != "agent died":
            assert time.monotonic() < deadline, f"the agent's death was not noticed: {status}"
            time.sleep(0.05)
        started = time.monotonic()
        backend.assign("killed", [("local", 0)])
        assert time.monotonic() - started < 9, "the restart waited on the dead agent's store"
        _serving(backend, "killed")
        assert int(json.loads(record.read_text())["pid"]) != dead_pid
        deadline = time.monotonic() + 60
        live = (WorkerState.STARTING, WorkerState.RUNNING)
        while True:
            status = backend.poll()["killed"]
            if any(w.worker_id == 1 and w.state in live for w in status.workers):
                break
            assert time.monotonic() < deadline, f"no new worker: {status}"
            time.sleep(0.05)
    finally:
        backend.close()


def test_an_agent_whose_job_ended_before_it_was_looked_at_is_not_a_failed_start(
    tmp_path: Path,
) -> None:
    """A job whose workers end at once: its agent writes its final status, removes its
    record and exits before the backend's first look. That is a job started and over,
    not an agent that failed to start (which failed such jobs under load)."""
    import subprocess
    from dataclasses import asdict

    from tidal.backends.local_agents import AgentBoot, AgentHandle
    from tidal.launch.agent import AgentStatus, final_path
    from tidal.launch.agent_config import AgentConfig

    backend = LocalBackend(tmp_path)
    config = AgentConfig(launch=_plain("quick", "pass", tmp_path), slots=["local:0"])

    def exited_agent() -> AgentHandle:
        finished = subprocess.Popen([sys.executable, "-c", "pass"])
        assert finished.wait(timeout=60) == 0
        boot = AgentBoot(config, time.monotonic() + 60, retries=0, first=True)
        agent = AgentHandle("quick", finished.pid, None, None, process=finished, boot=boot)
        backend._agents["quick"] = agent
        return agent

    exited_agent()
    final = final_path(backend.state_dir, "quick")
    final.write_text(json.dumps(asdict(AgentStatus("quick", 1, outcome="succeeded"))))
    status = backend.poll()["quick"]
    assert status.finished and not status.failed
    final.unlink()
    exited_agent()  # no final status: a failed start
    status = backend.poll()["quick"]
    assert status.failed and "agent exited with status 0 before it started" in status.reason


def test_a_start_returns_at_once_and_what_was_asked_meanwhile_is_carried_out(
    tmp_path: Path,
) -> None:
    """``start`` spawns the agent and returns: the slots are reported held while it
    starts, and a stop or new slots given before it serves are carried out once it does
    (the stopped job leaves no worker; the other grows onto its second slot)."""
    data = tmp_path / "data"
    backend = LocalBackend(data)
    a, b, c = ("local", 0), ("local", 1), ("local", 2)
    try:
        backend.start(_plain("stopped", SLEEP, tmp_path / "s"), [a])
        backend.start(_plain("grown", SLEEP, tmp_path / "g"), [b])
        assert not (data / "agents" / "stopped.agent.json").exists(), "start waited for it"
        first = backend.poll()
        assert first["stopped"].alive_slots() == {a}, first
        assert first["grown"].alive_slots() == {b}, first
        backend.stop("stopped")
        backend.assign("grown", [b, c])
        deadline = time.monotonic() + 120
        while True:
            polled = backend.poll()
            grown = polled.get("grown")
            running = {
                s
                for w in (grown.workers if grown else ())
                if w.state is WorkerState.RUNNING or w.pid is not None
                for s in w.held
            }
            if "stopped" not in polled and running == {b, c}:
                assert backend._agents["grown"].boot is None
                break
            assert time.monotonic() < deadline, f"not carried out: {polled}"
            time.sleep(0.05)
        final = json.loads((data / "agents" / "stopped.final.json").read_text())
        assert final["outcome"] == "stopped"
        assert all(w["state"] != "running" for w in final["workers"])
    finally:
        backend.close()


def test_an_agent_record_whose_store_answers_nothing_is_a_lost_job_not_a_crash(
    tmp_path: Path,
) -> None:
    """A record left by a killed agent whose pid still runs (not yet reaped, or taken by
    another process) with nothing serving its store: the next backend starts, the record
    is dropped and the job is not reported (the controller takes it for lost)."""
    agents = tmp_path / "data" / "agents"
    agents.mkdir(parents=True)
    with socket.socket() as closed:  # a port nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    record = agents / "ghost.agent.json"
    record.write_text(
        json.dumps({"job_id": "ghost", "pid": os.getpid(), "store": f"127.0.0.1:{port}"})
    )
    backend = LocalBackend(tmp_path / "data")
    try:
        assert not record.exists()
        assert "ghost" not in backend.poll()
    finally:
        backend.close()


def test_a_new_backend_numbers_its_orders_past_one_the_agent_took_but_had_not_reported(
    tmp_path: Path,
) -> None:
    """The agent took an assignment, but the status it last published (what a new backend
    reads on re-attaching) predates it. The new backend's orders must still be numbered
    past it: the agent ignores a number it has seen, so the job stayed at its old size."""
    from dataclasses import asdict, replace

    from tidal.launch.agent import KEY_STATUS, AgentStatus

    data = tmp_path / "data"
    a, b = ("local", 0), ("local", 1)
    first = LocalBackend(data)
    backends = [first]

    def alive_on(backend: LocalBackend, slots: set[tuple[str, int]], what: str) -> None:
        deadline = time.monotonic() + 60
        while (status := backend.poll().get("plain")) is None or status.alive_slots() != slots:
            assert time.monotonic() < deadline, f"{what}: {status}"
            time.sleep(0.05)

    try:
        first.start(
            _plain("plain", SLEEP, tmp_path),
            [a, b],
        )
        alive_on(first, {a, b}, "two workers")
        first.assign("plain", [a])
        alive_on(first, {a}, "one worker")
        store = first._agents["plain"].store
        assert store is not None
        taken = AgentStatus.from_json(store.get(KEY_STATUS))
        assert taken.assign_seq == 1
        stale = json.dumps(asdict(replace(taken, assign_seq=0)))
        for _ in range(20):
            # The report from before the order; the agent writes its own again within a
            # second, so until a new backend has read the stale one, try again.
            store.set(KEY_STATUS, stale)
            again = LocalBackend(data)  # the controller restarted
            backends.append(again)
            assert again._agents["plain"].last is not None
            if again._agents["plain"].last.assign_seq == 0:
                break
        else:
            pytest.fail("no new backend read the stale status")
        again.assign("plain", [a, b])
        alive_on(again, {a, b}, "two workers again, ordered by the re-attached backend")
    finally:
        backends[-1].stop("plain")
        for backend in reversed(backends):
            backend.close()


def test_a_job_that_ends_on_a_full_disk_is_reported_ended(tmp_path: Path) -> None:
    """The agent cannot write its final status file (the data dir's disk is full): the
    backend reads the same status from the agent's store, so the job is recorded as it
    ended, not taken for lost and run again."""
    go = tmp_path / "go"  # outside the data dir
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    with mounted_tmpfs(tmp_path / "data") as data:
        backend = LocalBackend(data)
        try:
            backend.start(_plain("full", code, tmp_path), [("local", 0)])
            # The agent started and serving (it writes its record): then the disk fills.
            _serving(backend, "full")
            filler = fill(data)
            go.touch()
            deadline = time.monotonic() + 120
            while (status := backend.poll().get("full")) is None or not (
                status.finished or status.failed
            ):
                assert time.monotonic() < deadline, f"the job's end was not seen: {status}"
                time.sleep(0.05)
            assert status.finished and not status.failed, status
            assert not (data / "agents" / "full.final.json").exists()
            assert not list((data / "agents").glob("*.tmp"))
            filler.unlink()
        finally:
            backend.close()
