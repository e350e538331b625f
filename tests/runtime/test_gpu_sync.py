"""On a GPU, the training step never waits for the device: a world-1 NCCL job runs every
step path with ``torch.cuda.set_sync_debug_mode("error")`` armed after a warm-up; and a
guarded collective's value is ready on the caller's stream when its wait returns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.runtime.env import ENV_STORE

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU)"),
]


def _run(script: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run ``tests/scripts/<script>`` alone (a world-1 job hosting its own store) on GPU 0."""
    env = dict(os.environ, TIDAL_HOME=str(home), CUDA_VISIBLE_DEVICES="0")
    env.pop(ENV_STORE, None)
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.parametrize("path", ["plain", "autoscale", "micro", "scaler"])
def test_a_step_has_no_host_synchronisation(path: str, tmp_path: Path) -> None:
    done = _run("gpu_sync_job.py", "--path", path, home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no host synchronisation" in done.stdout, done.stdout + done.stderr


def test_a_guarded_collective_is_ready_on_the_callers_stream(tmp_path: Path) -> None:
    done = _run("gpu_stream_order.py", home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seen 1.0" in done.stdout, done.stdout + done.stderr
