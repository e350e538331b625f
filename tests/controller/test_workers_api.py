"""The SDK's worker verbs against a real API server (in-memory backend, ticked by hand):
what they submit, what they report, and what they refuse without storing anything."""

from __future__ import annotations

import time

import pytest

from tests.controller.conftest import Served
from tidal.cli.main import controller_app, run_app
from tidal.client import Conflict, InvalidRequest, NotFound, WorkerArgumentError
from tidal.client.ps_cluster import cluster_job_spec
from tidal.controller.cluster import ClusterModel


def _tick(served: Served) -> None:
    """One tick starts what fits, the next records the workers the backend reports."""
    served.controller.tick()
    served.controller.tick()


def _stored(served: Served) -> tuple[object, ...]:
    return (served.store.list_jobs(), served.store.events())


def test_launched_workers_are_one_fixed_job_with_addresses(served: Served) -> None:
    served.controller.cluster = ClusterModel.single(4, name="h", address="10.1.2.3")
    with served.client() as client:
        ids = client.launch_workers(2, command="python -c 'print(1)'", cpu=0.5, name="etl")
        job_id = ids[0].split("/")[0]
        assert ids == [f"{job_id}/0", f"{job_id}/1"]
        job = client.get(job_id)
        assert (job.min_slots, job.max_slots, job.state) == (2, 2, "queued")
        pending = client.await_workers(ids, timeout_seconds=0.2)
        assert [w["status"] for w in pending["workers"]] == ["queued", "queued"]
        assert pending["failures"] == ids  # not up in time
        _tick(served)
        up = client.await_workers(ids, timeout_seconds=5)
    assert up["failures"] == []
    assert [(w["id"], w["host"], w["ip_address"], w["status"]) for w in up["workers"]] == [
        (ids[0], "h", "10.1.2.3", "running"),
        (ids[1], "h", "10.1.2.3", "running"),
    ]
    assert sorted(w["slot"] for w in up["workers"]) == [0, 1]


def test_a_wait_for_completion_reports_exit_codes(served: Served) -> None:
    with served.client() as client:
        ids = client.launch_workers(2, command="true")
        job_id = ids[0].split("/")[0]
        _tick(served)
        assert (
            client.await_workers(ids, wait_for_completion=True, timeout_seconds=0.1)["failures"]
            == ids
        )
        served.backend.finish(job_id)
        _tick(served)
        done = client.await_workers(ids, wait_for_completion=True, timeout_seconds=5)
    assert done["failures"] == []
    assert [(w["status"], w["exit_code"]) for w in done["workers"]] == [("exited", 0)] * 2


def test_a_failed_worker_is_a_failure(served: Served) -> None:
    with served.client() as client:
        ids = client.launch_workers(2, command="true")
        job_id = ids[0].split("/")[0]
        _tick(served)
        served.backend.fail_worker(job_id, 0, exit_code=3)
        _tick(served)
        result = client.await_workers(ids, timeout_seconds=5)
        assert client.get(job_id).state == "failed"  # no restart budget: the job ends
    assert result["failures"][0] == ids[0]
    assert result["workers"][0]["exit_code"] == 3


def test_stopping_some_workers_lowers_the_job_and_every_worker_cancels_it(
    served: Served,
) -> None:
    with served.client() as client:
        ids = client.launch_workers(3, command="sleep 100")
        job_id = ids[0].split("/")[0]
        _tick(served)
        slot_of = {w.worker_id: (w.host, w.slot) for w in client.get(job_id).worker_list}
        assert client.stop_workers(ids[1:2]) == [job_id]
        asked = client.get(job_id)  # the answer shows what was asked, before the tick
        assert (asked.min_slots, asked.max_slots) == (2, 2)
        _tick(served)
        job = client.get(job_id)
        assert job.state == "running"
        assert sorted(tuple(s) for s in job.slots) == sorted([slot_of[0], slot_of[2]])
        states = {w.worker_id: w.state for w in job.worker_list}
        assert states == {0: "running", 1: "released", 2: "running"}
        kinds = [e.kind for e in client.events(job_id)]
        assert "stop_workers" in kinds
        _tick(served)  # a stopped worker is not replaced
        assert len(client.get(job_id).worker_list) == 3
        assert client.stop_workers(ids[1:2]) == []  # already stopped: nothing to ask
        before = _stored(served)
        with pytest.raises(Conflict, match=rf"^workers\[0\]: worker 1 of job {job_id} is "):
            client._request("POST", f"/jobs/{job_id}/workers/stop", json={"workers": [1]})
        assert _stored(served) == before
        assert client.stop_workers(ids) == [job_id]
        _tick(served)
        assert client.get(job_id).state == "cancelled"
        stopped = client.await_workers(ids, wait_for_completion=True, timeout_seconds=5)
        assert [w["status"] for w in stopped["workers"]] == ["released"] * 3
        assert stopped["failures"] == ids
        assert client.stop_workers(ids) == []  # nothing runs any more


def test_an_elastic_job_is_not_stopped_below_its_minimum(served: Served) -> None:
    with served.client() as client:
        job_id = client.submit({"name": "el", "command": "sleep 100", "workers": "2:3"}).id
        _tick(served)
        assert len(client.get(job_id).slots) == 3
        before = _stored(served)
        with pytest.raises(Conflict, match=r"^workers: stopping 2 worker\(s\) would leave"):
            client.stop_workers([f"{job_id}/0", f"{job_id}/1"])
        assert _stored(served) == before
        assert client.stop_workers([f"{job_id}/0"]) == [job_id]
        assert client.get(job_id).target_slots == 2
        # Asked before the loop applied the first: together they would go below the min.
        with pytest.raises(Conflict, match=r"would leave job .* 1, below its minimum of 2"):
            client.stop_workers([f"{job_id}/1"])
        _tick(served)
        job = client.get(job_id)
        assert sorted(w.worker_id for w in job.worker_list if w.state == "running") == [1, 2]
        assert job.max_slots == 3  # still elastic: it may grow again


def test_unknown_ids_are_named_and_bad_arguments_store_nothing(served: Served) -> None:
    with served.client() as client:
        with pytest.raises(NotFound, match=r"^ids\[0\]: no job 'nope'"):
            client.await_workers(["nope/0"])
        ids = client.launch_workers(1, command="true")
        job_id = ids[0].split("/")[0]
        with pytest.raises(NotFound, match=rf"^ids\[1\]: job {job_id} has no worker 5"):
            client.stop_workers([ids[0], f"{job_id}/5"])
        with pytest.raises(WorkerArgumentError, match=r"^ids\[0\]: "):
            client.await_workers(["nope"])
        with pytest.raises(WorkerArgumentError, match=r"^timeout_seconds: "):
            client.await_workers(ids, timeout_seconds=-1)
        before = _stored(served)
        for kwargs in (
            {"n": 0, "command": "true"},
            {"n": 1, "command": "true", "cpu": -1.0},
            {"n": 1},
            {"n": 1, "command": "true", "script": "x.py"},
        ):
            with pytest.raises(WorkerArgumentError):
                client.launch_workers(**kwargs)
        # Refused by the server (no host has 64 slots for one worker): told as the
        # argument, not the field.
        with pytest.raises(InvalidRequest) as caught:
            client.launch_workers(1, command="true", gpus=64)
        assert [p for p, _ in caught.value.problems] == ["gpus"]
        assert _stored(served) == before


def test_the_cluster_spec_is_valid_but_for_what_this_server_cannot_run(served: Served) -> None:
    spec = cluster_job_spec(3, 2, worker_script="examples/ps_digits.py", mode="sync")
    with served.client() as client:
        check = client._request("POST", "/jobs/validate", json=spec).json()
        # Only capability refusals (several roles, the ps launcher) where the server lacks
        # them; none at all where it has them.
        assert all("is not available on this server yet" in p["msg"] for p in check["problems"])
        assert check["valid"] == (not check["problems"])
        before = _stored(served)
        with pytest.raises(WorkerArgumentError, match=r"^n_ps: a parameter-server job needs"):
            client.run_cluster(2, 0, worker_script="examples/ps_digits.py")
        with pytest.raises(WorkerArgumentError, match=r"^worker_script: required"):
            client.run_cluster(2, 1)
        assert _stored(served) == before


def test_a_wait_polls_with_backoff_and_returns_once_settled(served: Served) -> None:
    with served.client() as client:
        ids = client.launch_workers(1, command="true")
        _tick(served)
        started = time.monotonic()
        client.await_workers(ids, timeout_seconds=30)
        assert time.monotonic() - started < 2.0


def test_cli_marks_failures_and_names_bad_arguments(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--url", served.url, "--token", served.token]
    assert run_app(controller_app, ["workers", "launch", "2", "--command", "true", *where]) == 0
    ids = capsys.readouterr().out.split()
    job_id = ids[0].split("/")[0]
    _tick(served)
    served.backend.fail_worker(job_id, 0, exit_code=3)
    _tick(served)
    code = run_app(controller_app, ["workers", "await", *ids, "--timeout", "5", *where])
    out, _ = capsys.readouterr()
    assert code == 1
    assert f"{ids[0]}" in out and "failed (failure)" in out
    before = _stored(served)
    for argv, named in (
        (["workers", "launch", "0", "--command", "true"], "n: "),
        (["workers", "launch", "1"], "script/command: "),
        (["workers", "launch", "1", "--command", "true", "--script", "a.py"], "script/command: "),
        (["workers", "launch", "1", "--command", "true", "--cpus", "-1"], "cpu: "),
        (["workers", "launch", "1", "--command", "true", "--memory", "-1"], "memory: "),
        (["workers", "launch", "1", "--command", "true", "--gpus", "64"], "gpus: "),
        (["workers", "launch", "1", "--command", "true", "--env", "novalue"], "--env"),
        (["workers", "await", "bad-id"], "ids[0]: "),
        (["workers", "await", ids[0], "--timeout", "-1"], "--timeout"),
        (["workers", "stop", "nope/0"], "ids[0]: no job 'nope'"),
        (["workers", "stop", ids[0], f"{job_id}/9"], "ids[1]: "),
    ):
        code = run_app(controller_app, [*argv, *where])
        out, err = capsys.readouterr()
        assert code in (1, 2), (argv, out, err)
        assert out == ""
        assert len(err.strip().splitlines()) == 1 and named in err, (argv, err)
    assert _stored(served) == before
