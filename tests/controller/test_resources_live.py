"""A job's ``resources.cpus`` and ``resources.memory`` against a real ``tidal server``
(local backend, real workers): a worker past its memory limit is stopped and the job's
events say it exceeded that limit; a worker runs on the CPUs it asked for; a spec asking
more than any host has is refused at submission, naming the field."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client
from tidal.client.errors import InvalidRequest
from tidal.launch.limits import delegated_cgroup

pytestmark = pytest.mark.slow

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    tmp_path = tmp_path_factory.mktemp("resources")
    process = start_server(tmp_path, slots=2)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client, tmp_path
    finally:
        stop_server(process)


def _ended(client: Client, job: str, timeout: float = 90) -> dict[str, object]:
    until(lambda: client.get(job).state in TERMINAL, timeout, f"{job} to end")
    return client.get(job).model_dump()


def test_a_worker_past_its_memory_limit_is_stopped_and_the_events_say_so(
    live: tuple[Client, Path],
) -> None:
    client, _ = live
    # Asks for 3 GiB under a limit of 2 GiB: refused by the rlimit (MemoryError) or
    # killed in its cgroup, the reason is the same.
    script = "x = bytearray(3 << 30)  # zero-filled: every page touched\n"
    job = client.submit(
        {
            "name": "greedy",
            "command": [sys.executable, "-c", script],
            "workers": 1,
            "resources": {"memory": "2Gi"},
            "restart": {"max_restarts": 0},
        }
    )
    view = _ended(client, job.id)
    said = "exceeded its memory limit of 2 GiB"
    assert view["state"] == "failed"
    assert str(view["reason"]).endswith(said), view["reason"]
    events = [e for e in client.events(job.id) if e.kind == "failed"]
    assert events and events[0].message.endswith(said), events


@pytest.mark.skipif(delegated_cgroup() is not None, reason="a cgroup's cpu.max, not affinity")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs")
def test_each_worker_runs_on_the_cpus_it_asked_for(live: tuple[Client, Path]) -> None:
    client, tmp_path = live
    script = "import os; print('cpus', len(os.sched_getaffinity(0)))"
    job = client.submit(
        {
            "name": "pinned",
            "command": [sys.executable, "-c", script],
            "workers": 2,
            "resources": {"cpus": 1},
        }
    )
    view = _ended(client, job.id)
    assert view["state"] == "succeeded", view["reason"]
    logs = sorted((tmp_path / "data" / "jobs" / job.id / "logs").glob("worker-*.log"))
    assert [p.read_text().strip() for p in logs] == ["cpus 1", "cpus 1"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs")
def test_a_worker_that_asks_for_no_cpus_is_not_confined(live: tuple[Client, Path]) -> None:
    # A GPU worker's loader processes need the host's CPUs: unset cpus pins nothing.
    client, tmp_path = live
    script = "import os; print('cpus', len(os.sched_getaffinity(0)))"
    job = client.submit({"name": "free", "command": [sys.executable, "-c", script]})
    view = _ended(client, job.id)
    assert view["state"] == "succeeded", view["reason"]
    logs = list((tmp_path / "data" / "jobs" / job.id / "logs").glob("worker-*.log"))
    assert [p.read_text().strip() for p in logs] == [f"cpus {len(os.sched_getaffinity(0))}"]


@pytest.mark.parametrize(
    ("resources", "field"),
    [({"cpus": 4000}, "resources.cpus"), ({"memory": "512Ti"}, "resources.memory")],
)
def test_a_spec_asking_more_than_any_host_has_is_refused_naming_the_field(
    live: tuple[Client, Path], resources: dict[str, object], field: str
) -> None:
    client, _ = live
    before = len(client.list())
    spec = {"name": "huge", "command": ["/bin/true"], "resources": resources}
    with pytest.raises(InvalidRequest) as refused:
        client.submit(spec)
    assert field in str(refused.value)
    assert "the largest host this job may run on has" in str(refused.value)
    assert len(client.list()) == before  # nothing stored
