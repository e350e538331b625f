"""What a worker's Ray actor reserves on its node: the worker's ``resources.cpus`` and
``resources.memory``."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from tidal.backends.ray.worker import reservation
from tidal.launch.api import JobLaunch
from tidal.launch.limits import WorkerLimits
from tidal.launch.worker import worker_spec


def test_an_actor_reserves_what_its_worker_asked_for() -> None:
    launch = JobLaunch(job_id="j", argv=("python", "t.py"), cpus=2.0, memory=2 << 30)
    env = worker_spec(launch, timeout=10).env
    assert reservation(WorkerLimits.from_env(env)) == {"num_cpus": 2.0, "memory": 2 << 30}


def test_without_limits_an_actor_reserves_no_cpu() -> None:
    assert reservation(WorkerLimits()) == {"num_cpus": 0}
