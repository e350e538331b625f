"""The agent's status record stays readable across releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.launch.agent import AgentStatus
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobLaunch, RoleLaunch, WorkerState
from tidal.launch.worker import worker_spec


def test_a_record_of_the_previous_release_is_read_with_role_worker() -> None:
    old = {
        "job_id": "j1",
        "generation": 2,
        "workers": [
            {"id": 3, "slot": "h:1", "state": "running", "pid": 42, "exit_code": None},
        ],
        "assign_seq": 4,
        "outcome": None,
        "reason": "",
        "events": [],  # an earlier release also sent its events
    }
    status = AgentStatus.from_json(json.dumps(old)).job_status()
    (worker,) = status.workers
    assert (worker.worker_id, worker.slot, worker.state) == (3, ("h", 1), WorkerState.RUNNING)
    assert (worker.role, worker.index) == ("worker", None)


def test_roles_travel_through_the_record_and_the_launch_config() -> None:
    new = {
        "job_id": "j1",
        "generation": -1,
        "workers": [
            {
                "id": 0,
                "slot": "h:0",
                "state": "failed",
                "pid": 7,
                "exit_code": 3,
                "role": "ps",
                "index": 1,
                "added_later": True,
            },
        ],
    }
    (worker,) = AgentStatus.from_json(json.dumps(new)).job_status().workers
    assert (worker.role, worker.index, worker.exit_code) == ("ps", 1, 3)
    config = AgentConfig(
        launch=JobLaunch(
            job_id="j1",
            argv=("x",),
            roles=(RoleLaunch("ps", ("python", "ps.py"), launcher="ps", min=2, max=2),),
        ),
        slots=["h:0"],
    )
    again = AgentConfig.from_json(config.to_json())
    assert again == config
    (role,) = again.launch.roles
    assert (role.name, role.argv, role.launcher, role.max, role.policy) == (
        "ps",
        ("python", "ps.py"),
        "ps",
        2,
        "OnFailure",
    )
    # A launch config of an earlier release has no roles: one group, as before.
    old = {"job_id": "j", "argv": ["x"], "slots": []}
    assert AgentConfig.from_json(json.dumps(old)).launch.roles == ()


def test_a_launch_config_of_the_previous_release_still_loads(tmp_path: Path) -> None:
    # The flat form the previous release wrote: the launch's fields beside the agent's.
    old = {
        "job_id": "j2",
        "argv": ["python", "train.py"],
        "slots": ["h:0,1", "h:2,3"],
        "env": {"A": "1"},
        "working_dir": str(tmp_path),
        "log_dir": str(tmp_path / "logs"),
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint_every_steps": 5,
        "checkpoint_every_seconds": 60.0,
        "gpus": True,
        "timeout": 20.0,
        "first_worker_id": 4,
        "launcher": "torchrun",
        "role": "trainer",
        "max_restarts": 2,
        "roles": [{"name": "ps", "argv": ["ps.py"], "env": {"B": "2"}, "launcher": "ps"}],
        "replica_slots": 2,
    }
    config = AgentConfig.from_json(json.dumps(old))
    assert (config.slots, config.timeout, config.first_worker_id) == (["h:0,1", "h:2,3"], 20.0, 4)
    assert config.launch == JobLaunch(
        job_id="j2",
        argv=("python", "train.py"),
        env={"A": "1"},
        working_dir=tmp_path,
        log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_every_steps=5,
        checkpoint_every_seconds=60.0,
        gpu=True,
        launcher="torchrun",
        role="trainer",
        max_restarts=2,
        replica_slots=2,
        roles=(RoleLaunch("ps", ("ps.py",), env={"B": "2"}, launcher="ps"),),
    )
    # Written again, it takes this release's form and reads back the same.
    assert AgentConfig.from_json(config.to_json()) == config
    # The workers get what the old config said.
    spec = worker_spec(config.launch, timeout=config.timeout)
    assert (spec.job_id, spec.working_dir, spec.gpu, spec.timeout) == (
        "j2",
        str(tmp_path),
        True,
        20.0,
    )
    assert (spec.log_dir, spec.checkpoint_dir) == (tmp_path / "logs", str(tmp_path / "ckpt"))
    # The oldest form: no launcher, roles or replica slots (one tidal group).
    oldest = AgentConfig.from_json(json.dumps({"job_id": "j", "argv": ["x"], "slots": ["h:0"]}))
    assert (oldest.launch.launcher, oldest.launch.roles, oldest.launch.replica_slots) == (
        "tidal",
        (),
        1,
    )
    assert (oldest.launch.gpu, oldest.timeout, oldest.first_worker_id) == (False, 10.0, 0)


def test_a_malformed_launch_config_is_a_value_error() -> None:
    for text in ("[]", "{}", '{"launch": {"job_id": "j"}, "slots": []}', '{"job_id": "j"}'):
        with pytest.raises(ValueError):
            AgentConfig.from_json(text)
