"""What every backend must pass: the :class:`~tidal.backends.base.Backend` contract, on a
small real job (``tests/scripts/elastic_digits.py``) with real worker processes.

A backend's test module subclasses :class:`BackendConformance` as ``Test<Name>Conformance``
and provides the ``harness`` fixture (a :class:`Harness`). The cases:

- **start and stop**: ``start`` on two slots brings two running workers; ``stop`` releases
  them (rank 0 writes a durable checkpoint first), the job leaves ``poll`` and no worker
  process is left.
- **resize**: ``assign`` grows the job onto a third slot (a new generation, the two
  workers that stay keep their processes) and shrinks it to one (the others are reported
  released, not failed); worker logs are kept.
- **a killed worker**: SIGKILL one of two workers: it is reported failed with its exit
  status, the survivor goes on in a new generation, and no worker replaces it until the
  controller assigns its slot again (the restart decision is the controller's).
- **workers of two slots**: a job whose workers hold two slots each (``replica_slots``)
  started on four slots of one host runs two workers, each reporting both of its slots;
  given two of them it goes on with the worker whose slots stay, same process.
- **re-attach**: a new backend object on the same data dir (the controller restarted)
  finds the running job, with the same worker processes, and can resize and stop it. A
  backend whose jobs end with the controller says so (``reattach_unsupported``) and the
  case is skipped with that reason.

Every wait is bounded; a failed wait names what it waited for and the last status seen.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.processes import running as process_running
from tidal.backends.base import Backend
from tidal.launch.api import JobLaunch, JobStatus, WorkerState
from tidal.policy.api import Slot

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "elastic_digits.py"
JOB = "conformance"


@dataclass
class Harness:
    """How the suite runs one backend."""

    #: A backend on a data dir; called again with the same dir to re-attach.
    make: Callable[[Path], Backend]
    #: Three slots the backend can run workers on.
    slots: tuple[Slot, Slot, Slot]
    #: Four slots of one host (workers of two slots each).
    wide: tuple[Slot, Slot, Slot, Slot]
    #: Why the backend cannot re-attach to its jobs (``None``: it can).
    reattach_unsupported: str | None = None
    #: Seconds to wait for a change (workers start, a generation forms).
    timeout: float = 120.0
    made: list[Backend] = field(default_factory=list)

    def backend(self, data_dir: Path) -> Backend:
        """A backend on ``data_dir``, closed after the test."""
        backend = self.make(data_dir)
        self.made.append(backend)
        return backend

    def close(self) -> None:
        """Close every backend made (their jobs stop)."""
        for backend in reversed(self.made):
            backend.close()
        self.made.clear()


def launch(tmp_path: Path, replica_slots: int = 1) -> JobLaunch:
    """The job: trains far longer than any case, so it ends only when stopped."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    argv = (sys.executable, str(SCRIPT), "--out", str(out), "--epochs", "1000")
    return JobLaunch(
        job_id=JOB,
        argv=(*argv, "--step-delay", "0.05"),
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "ckpt",
        gpu=False,
        replica_slots=replica_slots,
    )


class Watch:
    """Polls one backend for the job, remembering every worker process seen."""

    def __init__(self, backend: Backend, timeout: float) -> None:
        self.backend = backend
        self.timeout = timeout
        self.last: JobStatus | None = None
        self.pids: set[int] = set()

    def poll(self) -> JobStatus | None:
        """The job's status now (``None`` once the backend no longer reports it)."""
        status = self.backend.poll().get(JOB)
        if status is not None:
            self.last = status
            self.pids |= {w.pid for w in status.workers if w.pid is not None}
        return status

    def until(self, check: Callable[[JobStatus], bool], what: str) -> JobStatus:
        """Poll until ``check`` holds for the job's status."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            status = self.poll()
            if status is not None and check(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last status: {self.last}")

    def gone(self) -> None:
        """Poll until the backend no longer reports the job."""
        deadline = time.monotonic() + self.timeout
        while self.poll() is not None:
            assert time.monotonic() < deadline, f"the job was never forgotten: {self.last}"
            time.sleep(0.05)


def running(status: JobStatus) -> set[Slot]:
    """Slots with a running worker."""
    return {w.slot for w in status.workers if w.state is WorkerState.RUNNING}


def running_on(*slots: Slot) -> Callable[[JobStatus], bool]:
    """Exactly ``slots`` have running workers, and no worker is starting."""
    return lambda s: (
        running(s) == set(slots) and not any(w.state is WorkerState.STARTING for w in s.workers)
    )


def assert_no_process(pids: set[int], timeout: float = 30.0) -> None:
    """Every process in ``pids`` ends within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        # A child of this process that exited is a zombie until reaped: gone too.
        left = {pid for pid in left if process_running(pid)}
        time.sleep(0.05)
    assert not left, f"worker processes left running: {sorted(left)}"


class BackendConformance:
    """The suite; a backend's module subclasses it and provides ``harness``."""

    def test_start_resize_and_stop(self, harness: Harness, tmp_path: Path) -> None:
        a, b, c = harness.slots
        backend = harness.backend(tmp_path / "data")
        watch = Watch(backend, harness.timeout)
        backend.start(launch(tmp_path), [a, b])
        first = watch.until(running_on(a, b), "2 running workers")

        backend.assign(JOB, [a, b, c])
        grown = watch.until(running_on(a, b, c), "3 running workers")
        assert grown.generation > first.generation
        kept = {w.slot: w.pid for w in first.workers if w.state is WorkerState.RUNNING}
        assert {w.slot: w.pid for w in grown.workers if w.slot in kept and w.pid} == kept, (
            "workers on slots that stay keep their processes"
        )

        backend.assign(JOB, [a])
        shrunk = watch.until(running_on(a), "1 running worker")
        assert shrunk.generation > grown.generation
        left = {w.slot for w in shrunk.workers if w.state is WorkerState.RELEASED}
        assert left >= {b, c}, shrunk
        assert not any(w.state is WorkerState.FAILED for w in shrunk.workers), shrunk
        assert backend.log_paths(JOB), "worker logs are kept"

        backend.stop(JOB)
        watch.gone()
        assert not watch.last or not watch.last.failed, watch.last
        assert list((tmp_path / "ckpt").glob("checkpoint-*.pt")), "rank 0 checkpoints first"
        assert_no_process(watch.pids)

    def test_workers_of_two_slots(self, harness: Harness, tmp_path: Path) -> None:
        a, b, c, d = harness.wide
        backend = harness.backend(tmp_path / "data")
        watch = Watch(backend, harness.timeout)
        backend.start(launch(tmp_path, replica_slots=2), [a, b, c, d])

        def workers(status: JobStatus) -> list[tuple[Slot, ...]]:
            return sorted(w.held for w in status.workers if w.state is WorkerState.RUNNING)

        def settled(status: JobStatus) -> bool:
            return not any(w.state is WorkerState.STARTING for w in status.workers)

        both = watch.until(
            lambda s: workers(s) == [(a, b), (c, d)] and settled(s), "2 workers of 2 slots"
        )
        assert both.alive_slots() == {a, b, c, d}
        kept = next(w for w in both.workers if w.held == (c, d))

        backend.assign(JOB, [c, d])
        shrunk = watch.until(lambda s: workers(s) == [(c, d)] and settled(s), "1 worker left")
        assert shrunk.generation > both.generation
        (stays,) = (w for w in shrunk.workers if w.state is WorkerState.RUNNING)
        assert (stays.worker_id, stays.pid) == (kept.worker_id, kept.pid)
        left = {w.held for w in shrunk.workers if w.state is WorkerState.RELEASED}
        assert left == {(a, b)}, shrunk
        backend.stop(JOB)
        watch.gone()
        assert_no_process(watch.pids)

    def test_killed_worker_is_replaced_only_when_assigned(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        a, b, _ = harness.slots
        backend = harness.backend(tmp_path / "data")
        watch = Watch(backend, harness.timeout)
        backend.start(launch(tmp_path), [a, b])
        before = watch.until(running_on(a, b), "2 running workers")
        victim = next(w for w in before.workers if w.slot == b)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)

        def failed(status: JobStatus) -> bool:
            return any(
                w.worker_id == victim.worker_id and w.state is WorkerState.FAILED
                for w in status.workers
            )

        after = watch.until(failed, f"worker {victim.worker_id} reported failed")
        dead = next(w for w in after.workers if w.worker_id == victim.worker_id)
        assert dead.exit_code == -signal.SIGKILL, dead
        assert not after.failed and not after.finished, after
        survivors = watch.until(
            lambda s: running_on(a)(s) and s.generation > before.generation,
            "the survivor in a new generation",
        )
        # Not replaced by the backend itself: the slot waits for the controller's decision.
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            status = watch.poll()
            assert status is not None and {w.slot for w in status.workers if w.state.alive} == {
                a
            }, f"a worker was started without an assign: {status}"
            time.sleep(0.05)

        backend.assign(JOB, [a, b])
        again = watch.until(running_on(a, b), "a new worker on the freed slot")
        new = next(w for w in again.workers if w.slot == b and w.state is WorkerState.RUNNING)
        assert new.worker_id > victim.worker_id, "worker ids are never reused"
        assert again.generation > survivors.generation
        backend.stop(JOB)
        watch.gone()
        assert_no_process(watch.pids)

    def test_reattach_after_the_controller_restarts(self, harness: Harness, tmp_path: Path) -> None:
        if harness.reattach_unsupported:
            pytest.skip(harness.reattach_unsupported)
        a, b, _ = harness.slots
        first = harness.backend(tmp_path / "data")
        watch = Watch(first, harness.timeout)
        first.start(launch(tmp_path), [a, b])
        seen = watch.until(running_on(a, b), "2 running workers")

        # A second backend on the same data dir (the controller restarted) finds the job.
        again = harness.backend(tmp_path / "data")
        watch = Watch(again, harness.timeout)
        found = watch.until(running_on(a, b), "the running job, re-attached")
        assert {w.pid for w in found.workers if w.state is WorkerState.RUNNING} == {
            w.pid for w in seen.workers if w.state is WorkerState.RUNNING
        }, "the same worker processes"
        watch.pids |= {w.pid for w in seen.workers if w.pid is not None}

        again.assign(JOB, [a])
        watch.until(running_on(a), "1 running worker, resized after re-attaching")
        again.stop(JOB)
        watch.gone()
        assert_no_process(watch.pids)


def python_children(parent: int, module: bytes) -> set[int]:
    """Processes of ``python -m <module>`` whose parent is ``parent`` (say, a pool's
    interpreters, ``b"tidal.launch.warm"``)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and module in cmdline:
            found.add(int(stat.parent.name))
    return found
