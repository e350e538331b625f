"""The SDK's worker verbs without a server: ids, the specs they submit, what a wait reports."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.client.ps_cluster import cluster_job_spec
from tidal.client.workers import (
    WorkerArgumentError,
    WorkerRef,
    argument_problems,
    launch_spec,
    parse_worker_ids,
    summarise,
    unknown_worker,
)
from tidal.model import job_from_spec
from tidal.spec import SpecError, parse_spec
from tidal.wire.schema import JobDetail


def test_worker_ids_round_trip_and_repeats_are_dropped() -> None:
    refs = parse_worker_ids(["train-1a2b3c/0", "train-1a2b3c/1", "train-1a2b3c/0", "x.y_z-9/12"])
    assert refs == [
        WorkerRef("train-1a2b3c", 0),
        WorkerRef("train-1a2b3c", 1),
        WorkerRef("x.y_z-9", 12),
    ]
    assert [str(r) for r in refs] == ["train-1a2b3c/0", "train-1a2b3c/1", "x.y_z-9/12"]
    assert parse_worker_ids("job/3") == [WorkerRef("job", 3)]


@pytest.mark.parametrize(
    ("ids", "where"),
    [
        (["job/0", "job"], "ids[1]"),
        (["job/-1"], "ids[0]"),
        (["job/0/1"], "ids[0]"),
        (["/0"], "ids[0]"),
        (["job/x"], "ids[0]"),
        ([7], "ids[0]"),
        ([], "ids"),
    ],
)
def test_a_malformed_worker_id_names_its_position(ids: list[Any], where: str) -> None:
    with pytest.raises(WorkerArgumentError) as caught:
        parse_worker_ids(ids)
    assert str(caught.value).startswith(f"{where}: ")


def test_launch_spec_is_n_fixed_replicas_that_are_not_restarted() -> None:
    spec = launch_spec(
        3, cpu=0.5, memory="256Mi", command="python -c 'print(1)'", env={"A": "b"}, name="etl"
    )
    parsed = parse_spec(spec)
    assert parsed.workers.min == parsed.workers.max_workers == 3
    assert parsed.command == ["python", "-c", "print(1)"]
    assert parsed.resources.cpus == 0.5
    assert parsed.resources.memory == 256 * 2**20
    assert parsed.resources.gpus == 0
    assert parsed.env == {"A": "b"}
    assert parsed.restart.max_restarts == 0
    assert parsed.name == "etl"


def test_a_script_runs_under_python_and_a_role_is_named() -> None:
    spec = parse_spec(launch_spec(2, script="train.py", role="evaluator"))
    assert spec.roles is not None and len(spec.roles) == 1
    role = spec.roles[0]
    assert (role.name, role.command, role.replicas.min, role.replicas.max_workers) == (
        "evaluator",
        ["python", "train.py"],
        2,
        2,
    )


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"n": 0, "command": "true"}, "n"),
        ({"n": -2, "command": "true"}, "n"),
        ({"n": True, "command": "true"}, "n"),
        ({"n": 2.0, "command": "true"}, "n"),
        ({"n": 1, "command": "true", "cpu": -1}, "cpu"),
        ({"n": 1, "command": "true", "cpu": 0}, "cpu"),
        ({"n": 1, "command": "true", "cpu": float("nan")}, "cpu"),
        ({"n": 1, "command": "true", "memory": -5}, "memory"),
        ({"n": 1, "command": "true", "memory": "lots"}, "memory"),
        ({"n": 1, "command": "true", "gpus": -1}, "gpus"),
        ({"n": 1}, "script/command"),
        ({"n": 1, "command": "true", "script": "a.py"}, "script/command"),
        ({"n": 1, "command": ""}, "command"),
        ({"n": 1, "command": []}, "command"),
        ({"n": 1, "script": ""}, "script"),
        ({"n": 1, "command": "true", "env": {"A": 1}}, "env"),
        ({"n": 1, "command": "true", "name": "Bad Name"}, "name"),
        ({"n": 1, "command": "true", "role": ""}, "role"),
    ],
)
def test_bad_launch_arguments_are_named(kwargs: dict[str, Any], argument: str) -> None:
    n = kwargs.pop("n")
    with pytest.raises(WorkerArgumentError, match=rf"^{argument}: "):
        launch_spec(n, **kwargs)


def test_server_problems_are_told_as_the_arguments_that_set_them() -> None:
    problems = [
        ("resources.gpus", "must be ≤ 1"),
        ("roles[0].resources.cpus", "x"),
        ("roles.ps.launcher", "y"),
        ("workers.min", "z"),
        ("labels", "w"),
    ]
    assert argument_problems(problems) == [
        ("gpus", "must be ≤ 1"),
        ("cpu", "x"),
        ("launcher", "y"),
        ("n", "z"),
        ("labels", "w"),
    ]


def _job(state: str, workers: list[dict[str, Any]], max_slots: int = 2) -> JobDetail:
    base = {
        "id": "w-1",
        "name": "w",
        "state": state,
        "reason": "",
        "priority": 1,
        "workers": len(workers),
        "min_slots": max_slots,
        "max_slots": max_slots,
        "target_slots": None,
        "slots": [],
        "restarts": 0,
        "labels": {},
        "target_group": None,
        "cancel_requested": False,
        "scale_deadline": None,
        "submitted_at": 0.0,
        "started_at": None,
        "finished_at": None,
        "updated_at": 0.0,
        "spec": {},
    }
    rows = [
        {"host": "h", "slot": w["worker_id"], "pid": None, "exit_code": None, **w} for w in workers
    ]
    return JobDetail.model_validate({**base, "worker_list": rows})


def _summary(job: JobDetail, completion: bool) -> list[tuple[str, bool, bool]]:
    refs = [WorkerRef("w-1", 0), WorkerRef("w-1", 1)]
    return [
        (r.status, r.settled, r.failed)
        for r in summarise(refs, {"w-1": job}, completion=completion)
    ]


def test_a_queued_job_has_queued_workers_that_are_not_settled() -> None:
    assert _summary(_job("queued", []), False) == [("queued", False, False)] * 2


def test_up_means_running_or_a_started_process() -> None:
    job = _job(
        "running",
        [
            {"worker_id": 0, "state": "starting", "pid": 123},
            {"worker_id": 1, "state": "starting"},
        ],
    )
    assert _summary(job, False) == [("starting", True, False), ("starting", False, False)]
    job = _job(
        "running",
        [
            {"worker_id": 0, "state": "running", "pid": 1},
            {"worker_id": 1, "state": "exited", "exit_code": 0},
        ],
    )
    assert _summary(job, False) == [("running", True, False), ("exited", True, False)]
    # Waiting for completion: a running worker is not settled yet.
    assert _summary(job, True) == [("running", False, False), ("exited", True, False)]


def test_failed_stopped_and_never_started_workers_are_failures() -> None:
    job = _job(
        "failed",
        [{"worker_id": 0, "state": "failed", "exit_code": 3}],
    )
    assert _summary(job, True) == [("failed", True, True), ("job failed", True, True)]
    stopped = _job(
        "cancelled", [{"worker_id": 0, "state": "released"}, {"worker_id": 1, "state": "released"}]
    )
    assert _summary(stopped, False) == [("released", True, True)] * 2


def test_unknown_worker_index() -> None:
    job = _job(
        "running", [{"worker_id": 0, "state": "running"}, {"worker_id": 3, "state": "running"}]
    )
    assert unknown_worker(WorkerRef("w-1", 1), job) is None  # one of the first max_slots
    assert unknown_worker(WorkerRef("w-1", 3), job) is None  # a replacement
    assert (
        unknown_worker(WorkerRef("w-1", 4), job) == "job w-1 has no worker 4 (its workers are 0-3)"
    )


def test_cluster_spec_has_a_ps_and_a_worker_role_with_the_config_in_env() -> None:
    spec = cluster_job_spec(
        3, 2, worker_script="examples/ps_digits.py", cpu=0.5, mode="sync", args=["--epochs", "2"]
    )
    roles = {r["name"]: r for r in spec["roles"]}
    assert roles["ps"]["replicas"] == 2 and roles["worker"]["replicas"] == 3
    assert {r["launcher"] for r in roles.values()} == {"ps"}
    assert roles["ps"]["ends_job"] is False and roles["worker"]["ends_job"] is True
    assert roles["worker"]["command"] == ["python", "examples/ps_digits.py", "--epochs", "2"]
    assert roles["ps"]["command"] == roles["worker"]["command"]
    assert spec["env"]["TIDAL_PS_N_PS"] == "2"
    assert spec["env"]["TIDAL_PS_MODE"] == "sync"
    assert spec["env"]["TIDAL_PS_MAX_WORKERS"] == "3"
    parsed = parse_spec(spec)  # the spec itself is valid; what a server runs is another matter
    assert parsed.roles is not None and [r.name for r in parsed.roles] == ["ps", "worker"]


def test_a_cluster_with_a_chief_ends_on_the_chiefs_success() -> None:
    spec = cluster_job_spec(2, 1, worker_script="examples/ps_digits.py", chief=True)
    roles = {r["name"]: r for r in spec["roles"]}
    assert roles["chief"]["replicas"] == 1 and roles["chief"]["launcher"] == "ps"
    assert roles["chief"]["command"] == roles["worker"]["command"]
    assert [r["ends_job"] for r in spec["roles"]] == [False, False, True]
    assert spec["env"]["TIDAL_PS_MAX_WORKERS"] == "2"  # the chief reads no data stream
    job = job_from_spec(parse_spec(spec))
    assert [r.name for r in job.roles if r.ends_job] == ["chief"]
    # without a chief: exactly as before
    plain = cluster_job_spec(2, 1, worker_script="examples/ps_digits.py")
    assert [(r["name"], r["ends_job"]) for r in plain["roles"]] == [
        ("ps", False),
        ("worker", True),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ps": 0}, "n_ps: a parameter-server job needs at least 1 server, got 0"),
        ({"n_ps": -1}, "n_ps: "),
        ({"n_workers": 0}, "n_workers: "),
        ({"mode": "fast"}, "mode: expected 'sync' or 'async'"),
        ({"mode": "sync", "replicas_to_aggregate": 5}, "replicas_to_aggregate: 5 is larger than"),
        ({"mode": "async", "replicas_to_aggregate": 1}, "replicas_to_aggregate: only meaningful"),
        ({"max_staleness": -1}, "max_staleness: "),
        ({"cpu": -1}, "cpu: "),
        ({"worker_script": ""}, "worker_script: "),
        ({"args": "--epochs 2"}, "args: "),
        ({"chief": "yes"}, "chief: expected true or false"),
    ],
)
def test_bad_cluster_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {"n_workers": 2, "n_ps": 1, "worker_script": "s.py", **kwargs}
    with pytest.raises(WorkerArgumentError, match="^" + message.replace("(", r"\(")):
        cluster_job_spec(given.pop("n_workers"), given.pop("n_ps"), **given)


def test_parse_spec_refuses_what_launch_spec_would_not_build() -> None:
    # The client checks first; the spec's own rules still hold for what it sends.
    with pytest.raises(SpecError):
        parse_spec({**launch_spec(1, command="true"), "workers": 0})
