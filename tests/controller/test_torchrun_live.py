"""A server job whose role says ``launcher: torchrun``: an unmodified DDP script starts on
3 workers, the scheduler resizes it to 2 by restarting every worker, and it resumes from
its own checkpoint and finishes its steps, trained."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "torchrun_ddp.py"
STEPS = 120
_STEP = re.compile(r"^step (\d+) world (\d+) loss", re.M)
_RESUMED = re.compile(
    r"^resumed at step (\d+) from \S+: world (\d+), TORCHELASTIC_RESTART_COUNT=(\d+)", re.M
)


def _logs(data: Path, job_id: str) -> str:
    logs = sorted((data / "jobs" / job_id / "logs").glob("worker-*.log"))
    return "\n".join(p.read_text() for p in logs)


def test_the_scheduler_resizes_a_torchrun_job_by_restarting_it(tmp_path: Path) -> None:
    process = start_server(tmp_path, slots=3)
    data = tmp_path / "data"
    try:
        with Client(data_dir=data, timeout=30) as client:
            job = client.submit(
                {
                    "name": "ddp",
                    "command": [
                        "python",
                        str(SCRIPT),
                        "--checkpoint",
                        str(tmp_path / "ckpt.pt"),
                        "--steps",
                        str(STEPS),
                        "--step-delay",
                        "0.05",
                    ],
                    "working_dir": str(tmp_path),
                    "workers": {"min": 1, "max": 3},
                    "launcher": "torchrun",
                    "restart": {"max_restarts": 1},
                }
            )

            def at_three(min_step: int) -> bool:
                return any(
                    int(s) >= min_step and w == "3" for s, w in _STEP.findall(_logs(data, job.id))
                )

            until(lambda: at_three(15), 240, "3 workers training")
            client.scale(job.id, 2)
            until(lambda: client.get(job.id).state in ("succeeded", "failed"), 300, "the end")
            detail = client.get(job.id)
            events = client.events(job.id)
            shown = subprocess.run(
                [sys.executable, "-m", "tidal.cli", "get", job.id, "--data-dir", str(data)],
                capture_output=True,
                text=True,
                timeout=60,
                env=dict(os.environ, COLUMNS="200"),
            ).stdout
    finally:
        stop_server(process)
    text = _logs(data, job.id)
    assert detail.state == "succeeded", (detail.reason, text[-3000:])
    assert detail.restarts == 0  # a resize is not a failure
    assert "fresh start: world 3, TORCHELASTIC_RESTART_COUNT=0" in text
    resumed = [(int(s), int(w), int(r)) for s, w, r in _RESUMED.findall(text)]
    assert [(w, r) for _, w, r in resumed] == [(2, 1)], resumed
    steps = [(int(s), int(w)) for s, w in _STEP.findall(text)]
    # Every step was done: printed, or (saved just before the stop landed, not printed)
    # the step the restart resumed after.
    assert {s for s, _ in steps} | {s for s, _, _ in resumed} == set(range(1, STEPS + 1))
    last_at_three = max(s for s, w in steps if w == 3)
    assert last_at_three >= 15
    assert last_at_three <= resumed[0][0] <= last_at_three + 1
    accuracy = float(re.findall(r"held-out accuracy ([\d.]+)", text)[-1])
    assert accuracy >= 0.9, text[-2000:]
    assert any(e.kind == "rescale" and "3 → 2" in e.message for e in events), events
    assert "launcher: torchrun (restart-based resize)" in shown, shown
