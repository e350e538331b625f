"""The scene tidal exists for, end to end: a real server, the local backend, real training.

8 slots. Job 1 (up to 8) gets all 8; job 2 arrives with the same priority → 4 / 4; job 2's
priority goes 5000 → 10000 → 3 / 5; job 1 finishes → job 2 grows to 8. Nobody restarts
from a checkpoint on the way, and both jobs train to the expected accuracy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server
from tidal.client import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"

pytestmark = pytest.mark.slow


def _start_server(tmp_path: Path) -> subprocess.Popen[str]:
    return start_server(tmp_path, slots=8)


def _stop_server(process: subprocess.Popen[str], tmp_path: Path) -> None:
    stop_server(process)  # SIGINT: jobs are released, agents end
    agents = subprocess.run(
        ["pgrep", "-f", f"tidal.launch.agent .*{tmp_path}"], capture_output=True, text=True
    )
    assert agents.stdout == "", "agents left behind"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Client, Path]]:
    process = _start_server(tmp_path)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client, tmp_path
    finally:
        _stop_server(process, tmp_path)


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _spec(name: str, epochs: int, result: Path) -> dict[str, object]:
    return {
        "name": name,
        "command": [
            "python",
            str(EXAMPLE),
            "--epochs",
            str(epochs),
            "--step-delay",
            "0.08",  # job 1 must outlast two cold starts of newcomers
            "--result",
            str(result),
        ],
        "workers": {"min": 1, "max": 8},
    }


def test_fair_share_scene(server: tuple[Client, Path]) -> None:
    client, tmp = server

    def running(job: str) -> int:
        return sum(w.state == "running" for w in client.get(job).worker_list)

    job1 = client.submit(_spec("job1", 10, tmp / "job1.json")).id
    _until(lambda: running(job1) == 8, 120, "job 1 on 8 workers")

    job2 = client.submit(_spec("job2", 12, tmp / "job2.json")).id
    _until(lambda: running(job1) == 4 and running(job2) == 4, 120, "4 / 4")

    client.priority(job2, 10000)
    _until(lambda: running(job1) == 3 and running(job2) == 5, 120, "3 / 5")
    assert client.get(job1).state == "running", "job 1 ended too early for the scene"

    assert client.wait(job1, timeout=300).state == "succeeded"
    _until(lambda: running(job2) == 8, 120, "job 2 on 8 workers")
    assert client.wait(job2, timeout=300).state == "succeeded"

    # The allocation timeline, as the charts read it.
    counts: dict[str, int] = {job1: 0, job2: 0}
    phases: list[tuple[int, int]] = []
    for point in sorted(client.allocations(), key=lambda a: a.time):
        counts[point.job_id] = point.count
        phase = (counts[job1], counts[job2])
        if not phases or phases[-1] != phase:
            phases.append(phase)
    wanted = iter(phases)
    assert all(p in wanted for p in [(8, 0), (4, 4), (3, 5), (0, 8)]), phases

    for job, name in ((job1, "job1"), (job2, "job2")):
        view = client.get(job)
        assert view.restarts == 0, view
        kinds = [e.kind for e in client.events(job)]
        assert "failed" not in kinds and "restart" not in kinds, kinds
        result = json.loads((tmp / f"{name}.json").read_text())
        assert result["accuracy"] > 0.95, result


def test_controller_killed_mid_rescale_loses_nothing(tmp_path: Path) -> None:
    """kill -9 the server while a job grows: the job's workers go on training, the new
    server re-attaches to them, and the job finishes without a checkpoint restart."""
    process = _start_server(tmp_path)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            spec = _spec("job", 12, tmp_path / "job.json")
            spec["workers"] = {"min": 1, "max": 2}
            job = client.submit(spec).id
            _until(lambda: client.get(job).state == "running", 120, "the job to run")
            client.scale(job, 1)
            _until(lambda: client.get(job).workers == 1, 60, "scale to 1")
            client.scale(job, 2)  # a grow is now in flight
            pids = {w.pid for w in client.get(job).worker_list if w.state == "running"}
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert all(_alive(pid) for pid in pids if pid), "workers died with the server"

        process = _start_server(tmp_path)
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            assert [j.id for j in client.list()] == [job]
            assert client.wait(job, timeout=300).state == "succeeded"
            view = client.get(job)
            assert view.restarts == 0, [(e.kind, e.message) for e in client.events(job)]
            assert "restart" not in [e.kind for e in client.events(job)]
        result = json.loads((tmp_path / "job.json").read_text())
        assert result["accuracy"] > 0.95, result
    finally:
        _stop_server(process, tmp_path)


def test_job_whose_workers_died_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """kill -9 the server and every process of the job: the next server requeues the job
    and it resumes from its last durable checkpoint, not from the start."""
    process = _start_server(tmp_path)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            spec = _spec("job", 12, tmp_path / "job.json")
            spec.update(
                workers={"min": 1, "max": 2},
                checkpoint_every_steps=20,
                env={"TIDAL_LOG_LEVEL": "INFO"},
            )
            job = client.submit(spec).id
            checkpoints = tmp_path / "data" / "jobs" / job / "checkpoints"
            _until(lambda: len(list(checkpoints.glob("checkpoint-*.pt"))) >= 2, 180, "checkpoints")
        agents = subprocess.run(
            ["pgrep", "-f", f"tidal.launch.agent .*{tmp_path}"], capture_output=True, text=True
        ).stdout.split()
        workers = subprocess.run(
            ["pgrep", "-f", f"digits_mlp.py .*{tmp_path}"], capture_output=True, text=True
        ).stdout.split()
        assert agents and workers
        for pid in [process.pid, *map(int, agents), *map(int, workers)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=10)

        process = _start_server(tmp_path)
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            assert client.wait(job, timeout=300).state == "succeeded"
            logs = client.logs(job, tail=10_000)
        assert "resuming from" in logs, logs[-2000:]
        result = json.loads((tmp_path / "job.json").read_text())
        assert result["accuracy"] > 0.95, result
        assert result["steps"] == 12 * -(-1437 // 64)
    finally:
        _stop_server(process, tmp_path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
