"""A job's lifecycle against a real ``tidal server`` on 127.0.0.1: workers that exit 0
without tidal finish the job, a restart budget means exactly that many restarts, a failed
job keeps no live workers, and cancel leaves no process of the job behind."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.controller.live import start_server, stop_server, until
from tests.processes import running
from tidal.client import Client

pytestmark = pytest.mark.slow

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """One server for the module (each start costs seconds on a small machine)."""
    tmp_path = tmp_path_factory.mktemp("lifecycle")
    process = start_server(tmp_path, slots=4)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client, tmp_path
    finally:
        stop_server(process)


@pytest.fixture
def server(live: tuple[Client, Path]) -> Client:
    return live[0]


@pytest.fixture
def data_root(live: tuple[Client, Path]) -> Path:
    return live[1]


def _ended(client: Client, job: str, timeout: float = 60) -> dict[str, Any]:
    until(lambda: client.get(job).state in TERMINAL, timeout, f"{job} to end")
    return client.get(job).model_dump()


def _logs(tmp_path: Path, job_id: str) -> list[Path]:
    return sorted((tmp_path / "data" / "jobs" / job_id / "logs").glob("worker-*.log"))


@pytest.mark.parametrize("command", [["/bin/true"], ["python", "-c", "print(1)"]])
def test_workers_that_exit_0_without_tidal_finish_the_job(
    server: Client, data_root: Path, command: list[str]
) -> None:
    job = server.submit({"name": "plain", "command": command, "workers": 2})
    view = _ended(server, job.id)
    time.sleep(1.0)  # a runaway respawn would keep starting workers
    assert view["state"] == "succeeded", view["reason"]
    assert view["restarts"] == 0
    assert len(_logs(data_root, job.id)) == 2
    assert [w["state"] for w in view["worker_list"]] == ["exited", "exited"]


def test_a_restart_budget_of_one_means_two_attempts(server: Client, data_root: Path) -> None:
    job = server.submit(
        {"name": "bad", "command": ["/bin/false"], "workers": 1, "restart": {"max_restarts": 1}}
    )
    view = _ended(server, job.id)
    time.sleep(1.0)
    assert view["state"] == "failed"
    # Two attempts: the first worker and the one restart; the failure counter counts both.
    assert len(_logs(data_root, job.id)) == 2
    assert view["restarts"] == 2
    live = [w for w in view["worker_list"] if w["state"] in ("starting", "running")]
    assert live == []


def test_a_failed_job_says_which_exception_ended_its_worker(server: Client) -> None:
    script = (
        "import torch\n"
        "def build():\n"
        "    raise ValueError('lr must be positive, got -0.1')\n"
        "print('building the optimizer')\n"
        "build()\n"
    )
    job = server.submit(
        {
            "name": "raises",
            "command": [sys.executable, "-c", script],
            "workers": 1,
            "restart": {"max_restarts": 1},
        }
    )
    view = _ended(server, job.id)
    cause = "ValueError: lr must be positive, got -0.1"
    assert view["state"] == "failed"
    assert str(view["reason"]).endswith(cause), view["reason"]
    events = [e for e in server.events(job.id) if e.kind == "worker_failed"]
    assert events and events[0].message.endswith(cause), events


def test_log_files_are_private(server: Client, data_root: Path) -> None:
    job = server.submit({"name": "plain", "command": ["/bin/true"], "workers": 1})
    _ended(server, job.id)
    logs = _logs(data_root, job.id)
    assert logs
    for path in logs:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


GRANDCHILD = """
import os, subprocess, sys, time
pid = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
open(sys.argv[1], "w").write(str(pid))
time.sleep(600)
"""


def test_cancel_kills_grandchildren_in_their_own_session(server: Client, data_root: Path) -> None:
    script = data_root / "grandchild.py"
    script.write_text(GRANDCHILD)
    marker = data_root / "grandchild.pid"
    job = server.submit(
        {"name": "tree", "command": [sys.executable, str(script), str(marker)], "workers": 1}
    )
    until(lambda: marker.exists() and marker.read_text().strip() != "", 60, "the grandchild")
    pid = int(marker.read_text())
    assert running(pid)
    assert os.getsid(pid) == pid  # it left the worker's session
    server.cancel(job.id)
    _ended(server, job.id)
    until(lambda: not running(pid), 30, f"grandchild {pid} to be killed")


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"


def test_an_agent_that_dies_is_restarted_and_the_job_resumes(
    server: Client, data_root: Path
) -> None:
    result = data_root / "agent-kill.json"
    job = server.submit(
        {
            "name": "resumes",
            "command": [
                "python",
                str(EXAMPLE),
                "--epochs",
                "3",
                "--step-delay",
                "0.05",
                "--result",
                str(result),
            ],
            "workers": 2,
            "restart": {"max_restarts": 2},
            "checkpoint_dir": str(data_root / "agent-kill-ckpt"),
            "checkpoint_every_steps": 5,
        }
    )
    record = data_root / "data" / "agents" / f"{job.id}.agent.json"

    def running_pids() -> list[int]:
        workers = server.get(job.id).worker_list
        return [w.pid for w in workers if w.state == "running" and w.pid]

    until(lambda: len(running_pids()) == 2 and record.exists(), 90, "two running workers")
    old_pids = running_pids()
    agent_pid = int(json.loads(record.read_text())["pid"])
    os.kill(agent_pid, signal.SIGKILL)
    until(lambda: server.get(job.id).restarts == 1, 60, "the restart")

    def gone(pid: int) -> bool:
        return not running(pid)

    for pid in old_pids:
        until(partial(gone, pid), 30, f"old worker {pid} to be gone")
    view = _ended(server, job.id, timeout=180)
    assert view["state"] == "succeeded", view["reason"]
    assert view["restarts"] == 1
    assert json.loads(result.read_text())["accuracy"] > 0.9
    live = [w for w in view["worker_list"] if w["state"] in ("starting", "running")]
    assert live == []
    ids = [w["worker_id"] for w in view["worker_list"]]
    assert len(ids) == len(set(ids)) >= 4  # two new workers after the two lost
