"""On a GPU, the training step never waits for the device: a world-1 NCCL job runs every
step path with ``torch.cuda.set_sync_debug_mode("error")`` armed after a warm-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.runtime.env import ENV_STORE

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_sync_job.py"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU)"),
]


@pytest.mark.parametrize("path", ["plain", "autoscale", "micro", "scaler"])
def test_a_step_has_no_host_synchronisation(path: str, tmp_path: Path) -> None:
    env = dict(os.environ, TIDAL_HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="0")
    env.pop(ENV_STORE, None)  # alone: the job hosts its own store
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--path", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no host synchronisation" in done.stdout, done.stdout + done.stderr


def test_a_guarded_collective_is_ready_on_the_callers_stream(tmp_path: Path) -> None:
    env = dict(os.environ, TIDAL_HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="0")
    env.pop(ENV_STORE, None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("gpu_stream_order.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seen 1.0" in done.stdout, done.stdout + done.stderr
