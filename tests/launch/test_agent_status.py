"""The agent's status record stays readable across releases."""

from __future__ import annotations

import json
from dataclasses import asdict

from tidal.launch.agent import AgentConfig, AgentStatus
from tidal.launch.api import WorkerState


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
        job_id="j1",
        argv=["x"],
        slots=["h:0"],
        roles=[{"name": "ps", "argv": ["python", "ps.py"], "launcher": "ps", "min": 2, "max": 2}],
    )
    again = AgentConfig(**json.loads(json.dumps(asdict(config))))
    (role,) = again.role_launches()
    assert (role.name, role.argv, role.launcher, role.max, role.policy) == (
        "ps",
        ("python", "ps.py"),
        "ps",
        2,
        "OnFailure",
    )
    # A launch config of an earlier release has no roles: one group, as before.
    assert AgentConfig(job_id="j", argv=["x"], slots=[]).role_launches() == []
