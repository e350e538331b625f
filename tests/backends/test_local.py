"""The local backend with real agents and workers: start, resize, re-attach, stop."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidal.backends.base import JobLaunch, JobStatus, WorkerState
from tidal.backends.local import LocalBackend

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "elastic_digits.py"

pytestmark = pytest.mark.slow


def _until(
    backend: LocalBackend, job: str, check: Callable[[JobStatus], bool], timeout: float
) -> JobStatus:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = backend.poll().get(job, last)
        if last is not None and check(last):
            return last
        time.sleep(0.05)
    raise AssertionError(f"job {job} never reached the expected state; last: {last}")


def _running(n: int) -> Callable[[JobStatus], bool]:
    return lambda s: sum(w.state is WorkerState.RUNNING for w in s.workers) == n


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[list[LocalBackend]]:
    made: list[LocalBackend] = []
    yield made
    for backend in made:
        backend.close(grace=20)


def test_start_resize_reattach_and_stop(tmp_path: Path, backends: list[LocalBackend]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch = JobLaunch(
        job_id="job-1",
        argv=(
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            "40",
            "--step-delay",
            "0.05",
        ),
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "ckpt",
        gpu=False,
    )
    backend = LocalBackend(tmp_path / "data")
    backends.append(backend)
    backend.start(launch, [("local", 0), ("local", 1)])
    first = _until(backend, "job-1", _running(2), timeout=90)

    backend.assign("job-1", [("local", 0), ("local", 1), ("local", 2)])
    grown = _until(backend, "job-1", _running(3), timeout=90)
    assert grown.generation > first.generation
    assert {w.slot for w in grown.workers if w.state is WorkerState.RUNNING} == {
        ("local", 0),
        ("local", 1),
        ("local", 2),
    }

    # A second backend on the same state folder (the controller restarted) finds the job.
    again = LocalBackend(tmp_path / "data")
    backends.append(again)
    assert again.job_ids == ["job-1"]
    seen = _until(again, "job-1", _running(3), timeout=30)
    pids = {w.pid for w in seen.workers if w.state is WorkerState.RUNNING}
    assert pids == {w.pid for w in grown.workers if w.state is WorkerState.RUNNING}

    again.assign("job-1", [("local", 0)])
    shrunk = _until(again, "job-1", _running(1), timeout=90)
    released = [w for w in shrunk.workers if w.state is WorkerState.RELEASED]
    assert {w.slot for w in released} >= {("local", 1), ("local", 2)}
    assert again.log_paths("job-1"), "worker logs are kept"

    again.stop("job-1")
    deadline = time.monotonic() + 60
    while "job-1" in again.job_ids and time.monotonic() < deadline:
        again.poll()
        time.sleep(0.05)
    assert "job-1" not in again.job_ids
    # Stopped: the last worker was released after rank 0 wrote a durable checkpoint.
    assert list((tmp_path / "ckpt").glob("checkpoint-*.pt"))
    for w in shrunk.workers:
        if w.pid is not None:
            with pytest.raises(ProcessLookupError):
                os.kill(w.pid, 0)
