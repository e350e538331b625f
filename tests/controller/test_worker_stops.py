"""Whether some of a job's workers can be stopped (a pure decision): what the request
names, and why a stop is refused, naming the argument."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tidal.controller.loop.worker_stops import StopRefused, plan_stop
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.records import JobRecord, WorkerRecord
from tidal.controller.store.requests import StopWorkers
from tidal.launch.api import WorkerState
from tidal.model import JobState
from tidal.spec import parse_spec

RUNNING = WorkerState.RUNNING


def _job(spec: dict[str, Any], held: int, state: JobState = JobState.RUNNING) -> JobRecord:
    store = JobStore("sqlite://")
    job = store.add_job(parse_spec({"name": "j", **spec}))
    store.close()
    return replace(job, state=state, slots=tuple(("h", i) for i in range(held)))


def _workers(*states: tuple[str, WorkerState]) -> list[WorkerRecord]:
    """Worker ``i`` on slot ``h:i`` of role and state ``states[i]``."""
    return [
        WorkerRecord("j", i, ("h", i), 100 + i, state, None, 0.0, role=role)
        for i, (role, state) in enumerate(states)
    ]


def _plan(job: JobRecord, workers: list[WorkerRecord], ids: list[int]) -> Any:
    return plan_stop(job, job.job, workers, ids)


def test_a_fixed_job_stops_the_named_workers_and_runs_fewer() -> None:
    job = _job({"command": "a", "workers": 3}, held=3)
    workers = _workers(*[("worker", RUNNING)] * 3)
    assert _plan(job, workers, [2, 0]) == StopWorkers(
        (0, 2), (("h", 0), ("h", 2)), "worker", fixed=True
    )


def test_an_elastic_job_is_scaled_in_but_not_below_its_minimum() -> None:
    job = _job({"command": "a", "workers": "2:4"}, held=3)
    workers = _workers(*[("worker", RUNNING)] * 3)
    assert _plan(job, workers, [1]) == StopWorkers((1,), (("h", 1),), "worker", fixed=False)
    refused = _plan(job, workers, [0, 1])
    assert isinstance(refused, StopRefused) and refused.field == "workers"
    assert "would leave job" in refused.message and "minimum of 2" in refused.message


def test_a_worker_not_running_is_named_and_all_of_them_is_a_cancel() -> None:
    job = _job({"command": "a", "workers": 3}, held=3)
    workers = _workers(("worker", RUNNING), ("worker", WorkerState.RELEASED), ("worker", RUNNING))
    refused = _plan(job, workers, [0, 1])
    assert refused == StopRefused(
        "workers[1]", f"worker 1 of job {job.id} is released, not running"
    )
    assert _plan(job, workers, [7]).field == "workers[0]"  # never started
    every = _plan(job, workers, [0, 2])
    assert isinstance(every, StopRefused) and "cancel the job" in every.message


def test_a_worker_already_stopping_is_not_stopped_twice() -> None:
    job = replace(_job({"command": "a", "workers": 3}, held=3), release_slots=(("h", 1),))
    workers = _workers(*[("worker", RUNNING)] * 3)
    assert _plan(job, workers, [1, 2]) == StopWorkers((2,), (("h", 2),), "worker", fixed=True)
    # With worker 1 leaving, worker 0 is the last one: that is a cancel.
    assert isinstance(_plan(job, workers, [0, 2]), StopRefused)


def test_a_queued_job_and_an_empty_list_are_refused() -> None:
    queued = _job({"command": "a", "workers": 2}, held=0, state=JobState.QUEUED)
    refused = _plan(queued, [], [0])
    assert isinstance(refused, StopRefused) and refused.status == 409
    assert f"job {queued.id} is queued" in refused.message
    empty = _plan(_job({"command": "a", "workers": 2}, held=2), _workers(), [])
    assert isinstance(empty, StopRefused) and (empty.field, empty.status) == ("workers", 422)


def test_only_the_elastic_role_of_a_multi_role_job_stops_alone() -> None:
    spec = {
        "roles": [
            {"name": "chief", "command": "c", "replicas": 1, "launcher": "tf"},
            {"name": "worker", "command": "w", "replicas": "1:3", "launcher": "tf"},
        ]
    }
    job = _job(spec, held=4)
    workers = _workers(("chief", RUNNING), *[("worker", RUNNING)] * 3)
    assert _plan(job, workers, [3]) == StopWorkers((3,), (("h", 3),), "worker", fixed=False)
    refused = _plan(job, workers, [1, 0])
    assert isinstance(refused, StopRefused) and refused.field == "workers"  # two roles
    refused = _plan(job, workers, [0])
    assert isinstance(refused, StopRefused) and refused.field == "workers[0]"
    assert "replica of role chief" in refused.message


def _ps_job(env: dict[str, str] | None = None) -> tuple[JobRecord, list[WorkerRecord]]:
    spec = {
        "env": env or {},
        "roles": [
            {"name": "ps", "command": "s", "replicas": 1, "launcher": "ps", "ends_job": False},
            {"name": "worker", "command": "w", "replicas": 3, "launcher": "ps"},
        ],
    }
    return _job(spec, held=4), _workers(("ps", RUNNING), *[("worker", RUNNING)] * 3)


def test_a_parameter_server_jobs_workers_stop_alone_and_its_servers_do_not() -> None:
    job, workers = _ps_job()
    assert _plan(job, workers, [2]) == StopWorkers((2,), (("h", 2),), "worker", fixed=True)
    server = _plan(job, workers, [0])
    assert isinstance(server, StopRefused) and "replica of role ps" in server.message
    every = _plan(job, workers, [1, 2, 3])
    assert isinstance(every, StopRefused) and "every running worker replica" in every.message
    # A sync job whose servers wait for a fixed number of gradients a step keeps them.
    sync, _ = _ps_job({"TIDAL_PS_MODE": "sync", "TIDAL_PS_REPLICAS_TO_AGGREGATE": "3"})
    stalled = _plan(sync, workers, [2])
    assert isinstance(stalled, StopRefused) and "replicas_to_aggregate=3" in stalled.message
    follows, _ = _ps_job({"TIDAL_PS_MODE": "sync"})  # aggregates whatever workers there are
    assert isinstance(_plan(follows, workers, [2]), StopWorkers)


def test_the_model_of_a_job_with_stopped_replicas_runs_fewer_of_that_role() -> None:
    job, _ = _ps_job()
    lowered = replace(job, stopped_replicas={"worker": 1})
    replicas = {r.name: r.replicas.max for r in lowered.job.roles}
    assert replicas == {"ps": 1, "worker": 2}
    assert lowered.job.slot_range.max == 3 and job.job.slot_range.max == 4
