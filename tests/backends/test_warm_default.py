"""A job that can grow keeps warm interpreters by default, and its next worker is one."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tests.backends.conformance import (
    JOB,
    Watch,
    assert_no_process,
    launch,
    python_children,
    running_on,
)
from tidal.backends.local import LocalBackend
from tidal.launch.api import WorkerState
from tidal.launch.warm_plan import DEFAULT_POOL

pytestmark = pytest.mark.slow


def test_a_growable_job_starts_its_newcomer_from_the_pool(tmp_path: Path) -> None:
    a, b = ("local", 0), ("local", 1)
    backend = LocalBackend(tmp_path / "data")
    watch = Watch(backend, timeout=120)
    try:
        # An elastic group and no TIDAL_WARM_POOL: the default pool.
        backend.start(dataclasses.replace(launch(tmp_path), min_workers=1, max_workers=3), [a])
        watch.until(running_on(a), "1 running worker")
        record = tmp_path / "data" / "agents" / f"{JOB}.agent.json"
        agent = int(json.loads(record.read_text())["pid"])
        deadline = time.monotonic() + 60
        while len(pool := python_children(agent, b"tidal.launch.warm")) < DEFAULT_POOL:
            assert time.monotonic() < deadline, f"no pool once the job trained: {pool}"
            time.sleep(0.05)

        backend.assign(JOB, [a, b])
        grown = watch.until(running_on(a, b), "2 running workers")
        newcomer = next(
            w.pid for w in grown.workers if w.slot == b and w.state is WorkerState.RUNNING
        )
        assert newcomer in pool, "the newcomer started cold"
        # The newcomer keeps the pool's command line; the pool has one started in its place.
        refilled = python_children(agent, b"tidal.launch.warm") - {newcomer}
        assert len(refilled) == DEFAULT_POOL and pool - {newcomer} < refilled

        backend.stop(JOB)
        watch.gone()
    finally:
        backend.close()
    assert_no_process(watch.pids | pool | refilled)
