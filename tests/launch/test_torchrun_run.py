"""An unmodified torchrun DDP script under ``tidal run --launcher torchrun``: resized 3 → 2
by restarting every worker, then a worker crash restarts the group within the budget; the
script resumes from its own checkpoint each time and finishes its steps, trained."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.runtime.launcher import Launch
from tidal.launch.runs import lookup
from tidal.runtime.rendezvous import connect_store, request_resize

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "torchrun_ddp.py"
STEPS = 150
_STEP = re.compile(r"\[w\d+\] step (\d+) world (\d+) loss ([\d.]+)")
_RESUMED = re.compile(
    r"\[w\d+\] resumed at step (\d+) from \S+: world (\d+), TORCHELASTIC_RESTART_COUNT=(\d+)"
)
_GENERATION = re.compile(r"generation (\d+) \((?:start|restart), .*workers: (.*)$")


def _steps(lines: list[str]) -> list[tuple[int, int, float]]:
    return [(int(m[1]), int(m[2]), float(m[3])) for line in lines if (m := _STEP.search(line))]


def _resumed(lines: list[str]) -> list[tuple[int, int, int]]:
    return [(int(m[1]), int(m[2]), int(m[3])) for line in lines if (m := _RESUMED.search(line))]


def test_a_torchrun_script_is_resized_by_restart_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = "torchrun-e2e"
    launch = Launch(
        [
            "--launcher",
            "torchrun",
            "--workers",
            "1:3",
            "--max-restarts",
            "2",
            "--stop-grace",
            "10",
            "--run-id",
            run_id,
            "--",
            str(SCRIPT),
            "--checkpoint",
            str(tmp_path / "ckpt.pt"),
            "--steps",
            str(STEPS),
            "--step-delay",
            "0.05",
        ],
        home=tmp_path / "home",
        env={"COLUMNS": "250"},
    )
    try:
        launch.wait_for(lambda lines: any(s >= 20 for s, _, _ in _steps(lines)), 240)
        # What `tidal resize RUN --workers 2` does, without starting another interpreter.
        monkeypatch.setenv("TIDAL_HOME", str(tmp_path / "home"))
        record = lookup(run_id)
        assert record is not None
        host, _, port = record.store.rpartition(":")
        request_resize(connect_store(host, int(port), timeout=30), 2)
        launch.wait_for(lambda lines: len(_resumed(lines)) >= 1, 240)
        first = _resumed(launch.lines)[0]
        launch.wait_for(
            lambda lines: any(w == 2 and s >= first[0] + 5 for s, w, _ in _steps(lines)), 240
        )
        # Kill rank 1 of the restarted group: the whole group restarts (one restart).
        generations = [m for line in launch.lines if (m := _GENERATION.search(line))]
        assert generations[-1][1] == "1", generations[-1][0]
        victim = int(re.findall(r"1=w\d+\(pid (\d+)\)", generations[-1][2])[0])
        os.kill(victim, signal.SIGKILL)
        launch.wait_for(lambda lines: len(_resumed(lines)) >= 2, 240)
        code = launch.finish(timeout=300)
    finally:
        launch.close()
    out = launch.output()
    assert code == 0, out

    assert "fresh start: world 3, TORCHELASTIC_RESTART_COUNT=0" in out, out
    resumed = _resumed(launch.lines)
    assert [(w, r) for _, w, r in resumed] == [(2, 1), (2, 2)], resumed
    steps = _steps(launch.lines)
    # Every step of the run was done, and the last one is the step count asked for. Rank 0
    # saves a step before it prints it, so a stop can land in between: that step is done
    # (the restart resumes after it: "resumed at step N") though never printed.
    done = {s for s, _, _ in steps} | {s for s, _, _ in resumed}
    assert done == set(range(1, STEPS + 1)), out
    assert f"finished at step {STEPS}: held-out accuracy" in out
    # The restart resumed at the checkpoint of the last step done at 3 workers (rank 0
    # saves a step before it prints it: at most that one step is done again).
    at_three = [s for s, w, _ in steps if w == 3]
    assert max(at_three) >= 20
    assert max(at_three) <= first[0] <= max(at_three) + 1, (first, max(at_three))
    assert all(w == 2 for s, w, _ in steps if s > first[0]), out
    # Trained: the loss fell and the held-out digits are recognised.
    accuracy = float(re.findall(r"held-out accuracy ([\d.]+)", out)[-1])
    assert accuracy >= 0.9, out
    assert steps[-1][2] < steps[0][2] / 4, (steps[0], steps[-1])
    # The launcher said what it did: a restart-based resize, then one failure restart.
    assert "torchrun launcher: restart-based resize" in out, out
    assert "resize to 2 workers: stopping 3 workers (SIGTERM" in out, out
    assert "restarting every worker from the script's checkpoint (restart 1/2)" in out, out
    assert "succeeded (restarts: 1)" in out, out
    # No worker outlives the run.
    for pid in launch.worker_pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
