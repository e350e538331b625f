"""``tidal run`` spends its restart budget as the controller does (``decide_restart``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_a_crashing_worker_is_replaced_until_the_budget_is_spent(tmp_path: Path) -> None:
    crash = "import os, sys; print('crash', os.environ['TIDAL_WORKER_ID']); sys.exit(3)"
    run = [sys.executable, "-m", "tidal.cli", "run", "--workers", "1", "--max-restarts", "2"]
    result = subprocess.run(
        [*run, "--", sys.executable, "-c", crash],
        capture_output=True,
        text=True,
        timeout=120,
        # Wide enough that rich does not wrap a message.
        env=dict(os.environ, TIDAL_HOME=str(tmp_path), COLUMNS="200"),
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    # Two failures survived, each replaced by a fresh worker; the third fails the run.
    assert [w for w in ("w0", "w1", "w2", "w3") if f"crash {w}" in out] == ["w0", "w1", "w2"], out
    # One worker: each failure leaves no survivor, and no checkpoint was written.
    for worker, n in (("w0", 1), ("w1", 2)):
        assert (
            f"worker {worker} failed and none survived; restarting from the start "
            f"(no checkpoint yet) (restart {n}/2)"
        ) in out, out
    assert "worker w2 failed (exit [3]); restart limit 2 reached" in out, out
    assert "failed (restarts: 3)" in out, out
