"""Stopping a group's workers (the steps every group kind shares): who counts as killed,
what exit status is kept, and that nothing a worker started survives it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.processes import running
from tidal.launch.api import WorkerState
from tidal.launch.driver import worker_state
from tidal.launch.groups.elastic import WorkerGroup
from tidal.launch.log_sink import RotatingLog
from tidal.launch.process import LocalSpawner
from tidal.launch.worker import (
    Worker,
    WorkerPhase,
    WorkerSpec,
    close_outputs,
    kill_workers,
    wait_for_exit,
)

#: Starts a grandchild in its own session (out of reach of a kill of the worker's
#: process group), writes its pid, then runs until killed.
_DETACHING = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("ready", flush=True)
time.sleep(120)
"""


def test_kill_workers_marks_only_running_ones_killed_and_reaps_their_sessions(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    spawner = LocalSpawner()

    def start(worker_id: str, *argv: str) -> Worker:
        process = spawner.spawn(
            worker_id=worker_id, slot="h:0", argv=argv, env={}, cwd=None, on_line=lines.append
        )
        return Worker(worker_id, "h:0", process, phase=WorkerPhase.MEMBER)

    pid_file = tmp_path / "grandchild"
    detaching = start("w0", sys.executable, "-c", _DETACHING, str(pid_file))
    done = start("w1", sys.executable, "-c", "print('bye')")
    assert done.process.wait(timeout=60) == 0
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the worker never started its grandchild"
        time.sleep(0.02)
    grandchild = int(pid_file.read_text())
    assert running(grandchild)

    wait_for_exit([detaching], 0.1)  # bounded: returns although the worker keeps running
    assert detaching.process.poll() is None
    log_files = [RotatingLog(tmp_path / "log")]
    kill_workers([detaching, done])
    close_outputs([detaching, done], log_files)

    killed = (detaching.killed, detaching.exit_code, detaching.phase)
    assert killed == (True, -9, WorkerPhase.EXITED)
    # It ended on its own: its own status is kept and it is not the group's doing.
    assert (done.killed, done.exit_code, done.phase) == (False, 0, WorkerPhase.EXITED)
    deadline = time.monotonic() + 30
    while running(grandchild):
        assert time.monotonic() < deadline, "the detached grandchild outlived its worker"
        time.sleep(0.02)
    assert log_files == [] and "bye\n" in lines and "ready\n" in lines


def test_a_leaver_that_exits_with_an_error_is_released_and_a_member_that_does_failed() -> None:
    # A worker on its way out can end with an error when a peer dies in the handover (its
    # last collective breaks): the job asked it to go, so that is no failure to count.
    group = WorkerGroup(WorkerSpec(argv=["unused"], job_id="leave"))
    try:
        leaver, member = (
            Worker(
                worker_id,
                f"h:{i}",
                LocalSpawner().spawn(
                    worker_id=worker_id,
                    slot=f"h:{i}",
                    argv=[sys.executable, "-c", "raise SystemExit(1)"],
                    env={},
                    cwd=None,
                    on_line=lambda _line: None,
                ),
                phase=phase,
            )
            for i, (worker_id, phase) in enumerate(
                (("w0", WorkerPhase.LEAVING), ("w1", WorkerPhase.MEMBER))
            )
        )
        group.workers = {"w0": leaver, "w1": member}
        assert leaver.process.wait(timeout=60) == 1 and member.process.wait(timeout=60) == 1
        group.poll()
        assert (worker_state(leaver), leaver.exit_code) == (WorkerState.RELEASED, 1)
        assert (worker_state(member), member.exit_code) == (WorkerState.FAILED, 1)
    finally:
        group.stop(grace=1.0)
