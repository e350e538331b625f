"""The scene tidal exists for, end to end: a real server, the local backend, real training.

8 slots. Job 1 (up to 8) gets all 8; job 2 arrives with the same priority → 4 / 4; job 2's
priority goes 5000 → 10000 → 3 / 5; job 1 finishes → job 2 grows to 8. Nobody restarts
from a checkpoint on the way, and both jobs train to the expected accuracy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidal.client import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Client, Path]]:
    data = tmp_path / "data"
    process = subprocess.Popen(
        [sys.executable, "-m", "tidal.cli", "server", "--slots", "8", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, TIDAL_HOME=str(tmp_path / "home")),
    )
    try:
        deadline = time.monotonic() + 60
        while not (data / "server.json").exists():
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        with Client(data_dir=data, timeout=30) as client:
            yield client, tmp_path
    finally:
        process.send_signal(signal.SIGINT)  # jobs are released, agents end
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        agents = subprocess.run(
            ["pgrep", "-f", f"tidal.launch.agent .*{tmp_path}"], capture_output=True, text=True
        )
        assert agents.stdout == "", "agents left behind"


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
