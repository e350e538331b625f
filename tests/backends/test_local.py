"""The local backend (per-job agents and their worker subprocesses) passes the backend
conformance suite, re-attaching to its agents included."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.conformance import BackendConformance, Harness
from tidal.backends.base import JobLaunch, WorkerState
from tidal.backends.local import LocalBackend

pytestmark = pytest.mark.slow


class TestLocalConformance(BackendConformance):
    """Every case of the suite, on this machine's slots."""

    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        """Local backends, closed (jobs stopped, agents ended) after the test."""
        made = Harness(
            make=lambda data: LocalBackend(data),
            slots=(("local", 0), ("local", 1), ("local", 2)),
        )
        yield made
        made.close()


def test_a_job_that_ended_while_no_controller_watched_is_reported_ended(
    tmp_path: Path,
) -> None:
    """The controller was down while the job's workers finished: the next backend on the
    data dir reports the job finished (once), not gone, so it is not run again."""
    data = tmp_path / "data"
    first = LocalBackend(data)
    first.start(
        JobLaunch(
            job_id="quick",
            argv=(sys.executable, "-c", "pass"),
            log_dir=tmp_path / "logs",
            checkpoint_dir=tmp_path / "ckpt",
            gpu=False,
        ),
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
