"""A role's launcher, from the spec to what the backend is given and how a failure is
decided."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.controller.loop.launching import JobFiles, build_launch
from tidal.launch.run_args import UsageProblem, check_launcher
from tidal.model import Launcher, job_from_spec
from tidal.policy.restart import LostWorker, Restart, RestartView, decide_restart
from tidal.spec import parse_spec


def test_a_torchrun_role_reaches_the_backend(tmp_path: Path) -> None:
    spec = parse_spec(
        {
            "name": "ddp",
            "command": "python train.py",
            "launcher": "torchrun",
            "restart": {"max_restarts": 5},
        }
    )
    job = job_from_spec(spec, job_id="j1")
    assert job.role.launcher is Launcher.TORCHRUN
    assert job.role.launcher.resize_mode == "restart-based resize"
    launch = build_launch(job, JobFiles(tmp_path), gpu=False)
    assert (launch.launcher, launch.role, launch.max_restarts) == ("torchrun", "worker", 5)


def test_a_tidal_role_stays_in_place() -> None:
    job = job_from_spec(parse_spec({"name": "a", "command": "x"}))
    assert job.role.launcher is Launcher.TIDAL
    assert job.role.launcher.resize_mode == "in-place resize"


def test_a_failure_under_torchrun_restarts_every_worker_within_the_budget() -> None:
    lost = [LostWorker("w4", "h", 1)]
    view = RestartView(max_restarts=2, restarts=1, whole_group=True)
    decision = decide_restart(view, lost)
    assert isinstance(decision, Restart)
    assert decision.from_checkpoint
    assert decision.reason == (
        "worker w4 failed; restarting every worker from the script's checkpoint (restart 2/2)"
    )
    spent = decide_restart(RestartView(max_restarts=2, restarts=2, whole_group=True), lost)
    assert not isinstance(spent, Restart)


def test_tidal_run_refuses_what_torchrun_cannot_do() -> None:
    check_launcher("torchrun", stop_grace=5, given={"--resize-at": False})
    with pytest.raises(UsageProblem, match=r"--launcher: expected one of tidal, torchrun"):
        check_launcher("mpirun", stop_grace=5, given={})
    with pytest.raises(UsageProblem, match=r"--resize-at: not with --launcher torchrun"):
        check_launcher("torchrun", stop_grace=5, given={"--resize-at": True})
    with pytest.raises(UsageProblem, match=r"--stop-grace: expected seconds >= 0"):
        check_launcher("torchrun", stop_grace=-1, given={})
    check_launcher("tidal", stop_grace=5, given={"--resize-at": True})
