"""The SDK's worker verbs against a real ``tidal server`` on 127.0.0.1 (local backend, real
processes): launched workers hold slots like any job's, a wait reports where they run and
how they ended, stopping them leaves no process, and the CLI verbs do the same."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controller.live import start_server, stop_server, until
from tests.processes import running
from tidal.cli.main import controller_app, run_app
from tidal.client import Client
from tidal.client.ps_cluster import cluster_job_spec
from tidal.ps.config import Mode

pytestmark = pytest.mark.slow

#: Runs until the file named by its argument exists (at most a minute).
WAIT_FOR_FILE = (
    "import os, sys, time\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """One server for the module (each start costs seconds on a small machine)."""
    tmp_path = tmp_path_factory.mktemp("workers")
    process = start_server(tmp_path, slots=4)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client, tmp_path
    finally:
        stop_server(process)


def test_workers_hold_slots_report_their_host_and_exit_codes(
    live: tuple[Client, Path],
) -> None:
    client, tmp_path = live
    release = tmp_path / "release-1"
    ids = client.launch_workers(2, command=["python", "-c", WAIT_FOR_FILE, str(release)])
    job_id = ids[0].split("/")[0]
    up = client.await_workers(ids, timeout_seconds=60)
    assert up["failures"] == []
    workers = up["workers"]
    assert [w["id"] for w in workers] == ids
    assert {w["host"] for w in workers} == {socket.gethostname()}
    assert {w["ip_address"] for w in workers} == {"127.0.0.1"}
    assert sorted(w["slot"] for w in workers) in ([0, 1], [0, 2], [1, 2], [0, 3], [1, 3], [2, 3])
    assert all(w["status"] in ("starting", "running") for w in workers)
    # Scheduled slots like any job's: listed, and counted against the pool.
    assert job_id in [j.id for j in client.list()]
    cluster = client.cluster()
    assert cluster.used_slots == 2
    assert sum(u == job_id for h in cluster.hosts for u in h.used_by) == 2
    release.touch()
    done = client.await_workers(ids, wait_for_completion=True, timeout_seconds=60)
    assert done["failures"] == []
    assert [(w["status"], w["exit_code"]) for w in done["workers"]] == [("exited", 0)] * 2
    until(lambda: client.get(job_id).state == "succeeded", 30, "the job to succeed")


def test_a_worker_that_exits_3_is_a_failure(live: tuple[Client, Path]) -> None:
    client, _ = live
    ids = client.launch_workers(1, command=["python", "-c", "raise SystemExit(3)"])
    result = client.await_workers(ids, wait_for_completion=True, timeout_seconds=60)
    assert result["failures"] == ids
    assert (result["workers"][0]["status"], result["workers"][0]["exit_code"]) == ("failed", 3)


def test_stopped_workers_end_and_leave_no_process(live: tuple[Client, Path]) -> None:
    client, _ = live
    ids = client.launch_workers(2, command=["python", "-c", "import time; time.sleep(300)"])
    job_id = ids[0].split("/")[0]
    assert client.await_workers(ids, timeout_seconds=60)["failures"] == []
    pids = [w.pid for w in client.get(job_id).worker_list]
    assert len(pids) == 2 and all(pids)
    assert client.stop_workers(ids) == [job_id]
    ended = client.await_workers(ids, wait_for_completion=True, timeout_seconds=60)
    assert [w["status"] for w in ended["workers"]] == ["released", "released"]
    # The job's state follows on the controller's next look at the backend: bounded wait.
    until(lambda: client.get(job_id).state == "cancelled", 30, "the job to be cancelled")
    until(lambda: all(not running(p) for p in pids if p), 30, "the workers' processes to end")
    assert client.cluster().used_slots == 0


def test_stopping_one_worker_ends_it_and_the_others_run_on(live: tuple[Client, Path]) -> None:
    client, _ = live
    ids = client.launch_workers(3, command=["python", "-c", "import time; time.sleep(300)"])
    job_id = ids[0].split("/")[0]
    assert client.await_workers(ids, timeout_seconds=60)["failures"] == []
    workers = client.get(job_id).worker_list
    pids = {w.worker_id: w.pid for w in workers if w.pid}
    assert len(workers) == 3 and len(pids) == 3
    assert client.stop_workers([ids[1]]) == [job_id]
    ended = client.await_workers([ids[1]], wait_for_completion=True, timeout_seconds=60)
    assert ended["workers"][0]["status"] == "released"
    until(lambda: not running(pids[1]), 30, "the stopped worker's process to end")
    # The shrink is a rescale: the job is running again once its agent reports it done.
    until(lambda: client.get(job_id).state == "running", 30, "the job to run on")
    job = client.get(job_id)
    assert (job.max_slots, len(job.slots)) == (2, 2)
    assert running(pids[0]) and running(pids[2])
    live_ids = {w.worker_id for w in job.worker_list if w.state in ("starting", "running")}
    assert live_ids == {0, 2}  # not replaced
    until(lambda: client.cluster().used_slots == 2, 30, "the stopped worker's slot to free")
    assert client.stop_workers(ids) == [job_id]
    until(lambda: client.get(job_id).state == "cancelled", 60, "the job to be cancelled")
    until(lambda: all(not running(p) for p in pids.values() if p), 30, "every process to end")


def test_cli_verbs(live: tuple[Client, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, tmp_path = live
    where = ["--data-dir", str(tmp_path / "data")]
    code = run_app(
        controller_app,
        [
            "workers",
            "launch",
            "2",
            "--command",
            f"{sys.executable} -c 'print(7)'",
            "--json",
            *where,
        ],
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    ids = json.loads(out)
    assert len(ids) == 2
    code = run_app(
        controller_app,
        ["workers", "await", *ids, "--completion", "--timeout", "60", "--json", *where],
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [w["exit_code"] for w in json.loads(out)["workers"]] == [0, 0]
    code = run_app(controller_app, ["workers", "await", *ids, *where])
    out, _ = capsys.readouterr()
    assert code == 0
    assert all(i in out for i in ids) and "127.0.0.1" in out


PS_DIGITS = str(Path(__file__).resolve().parents[2] / "examples" / "ps_digits.py")


def _refusal(client: Client, spec: dict[str, object]) -> list[str]:
    """What this server says it cannot run in ``spec`` (capability problems only)."""
    check = client._request("POST", "/jobs/validate", json=spec).json()
    return [f"{p['path']}: {p['msg']}" for p in check["problems"]]


def _run_cluster(
    client: Client, n_workers: int, mode: Mode, args: list[str], chief: bool = False
) -> dict[str, Any]:
    """``run_cluster`` of one server and ``n_workers`` running ``examples/ps_digits.py``;
    the test is skipped where this server cannot run such a job."""
    spec = cluster_job_spec(n_workers, 1, worker_script=PS_DIGITS, args=args, chief=chief)
    missing = _refusal(client, spec)
    if missing:
        pytest.skip(f"this server cannot run this parameter-server job: {'; '.join(missing)}")
    return client.run_cluster(n_workers, 1, 1.0, None, PS_DIGITS, mode, args=args, chief=chief)


def test_run_cluster_trains_digits(live: tuple[Client, Path]) -> None:
    client, tmp_path = live
    out = tmp_path / "ps-out"
    cluster = _run_cluster(client, 2, "async", ["--epochs", "2", "--out", str(out)])
    assert cluster["failures"] == []
    assert len(cluster["ps"]) == 1 and len(cluster["workers"]) == 2
    assert set(cluster["addresses"].values()) == {"127.0.0.1"}
    done = client.await_workers(cluster["workers"], wait_for_completion=True, timeout_seconds=240)
    assert done["failures"] == []
    until(lambda: client.get(cluster["job"]).state == "succeeded", 60, "the job to succeed")
    results = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert [r["worker"] for r in results] == ["worker-0", "worker-1"]
    assert all(r["accuracy"] >= 0.9 for r in results), results
    # The servers are stopped once the workers are done (they exit 0 on the stop, or
    # are released if they outlast its grace): ended, not failed.
    servers = client.await_workers(cluster["ps"], wait_for_completion=True, timeout_seconds=60)
    assert [w["status"] for w in servers["workers"]] in (["exited"], ["released"])


def test_a_parameter_server_jobs_worker_stopped_mid_training_leaves_and_the_rest_finish(
    live: tuple[Client, Path],
) -> None:
    client, tmp_path = live
    out = tmp_path / "ps-stop-out"
    args = ["--epochs", "4", "--step-delay", "0.1", "--out", str(out)]
    cluster = _run_cluster(client, 3, "async", args)
    assert cluster["failures"] == []
    job_id = cluster["job"]
    trace = out / "worker-2.jsonl"
    until(
        lambda: trace.exists() and len(trace.read_text().splitlines()) >= 10,
        120,
        "worker-2 to train ten batches",
    )
    replica = next(w for w in client.get(job_id).worker_list if (w.role, w.index) == ("worker", 2))
    stopped = f"{job_id}/{replica.worker_id}"
    assert client.stop_workers([stopped]) == [job_id]
    left = client.await_workers([stopped], wait_for_completion=True, timeout_seconds=60)
    assert left["workers"][0]["status"] == "released"
    rest = [w for w in cluster["workers"] if w != stopped]
    done = client.await_workers(rest, wait_for_completion=True, timeout_seconds=240)
    assert done["failures"] == [], done
    until(lambda: client.get(job_id).state == "succeeded", 60, "the job to succeed")
    job = client.get(job_id)
    assert job.max_slots == 3  # one server and the two workers left
    # Not replaced: the job's workers are its first four, one of them stopped.
    assert len([w for w in job.worker_list if w.role == "worker"]) == 3
    results = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert [r["worker"] for r in results] == ["worker-0", "worker-1"]
    assert all(r["accuracy"] >= 0.9 for r in results), results
    # The stopped worker left mid-training: its trace ends before its stream did.
    steps = len(trace.read_text().splitlines())
    assert 10 <= steps < len((out / "worker-0.jsonl").read_text().splitlines())


def test_run_cluster_with_a_chief_ends_on_the_chief_after_the_workers(
    live: tuple[Client, Path],
) -> None:
    import torch
    from examples.ps_digits import accuracy, build_data, build_model

    client, tmp_path = live
    out = tmp_path / "ps-chief-out"
    args = ["--epochs", "2", "--out", str(out), "--eval-every", "1", "--timeout", "240"]
    cluster = _run_cluster(client, 2, "sync", args, chief=True)
    assert cluster["failures"] == []
    assert (len(cluster["ps"]), len(cluster["workers"]), len(cluster["chief"])) == (1, 2, 1)
    chief = client.await_workers(cluster["chief"], wait_for_completion=True, timeout_seconds=240)
    assert chief["failures"] == [], chief
    until(lambda: client.get(cluster["job"]).state == "succeeded", 60, "the job to succeed")
    workers = client.await_workers(cluster["workers"], wait_for_completion=True, timeout_seconds=30)
    assert [(w["status"], w["exit_code"]) for w in workers["workers"]] == [("exited", 0)] * 2
    # the chief saved the final parameters: a fresh net loaded with them classifies digits
    saved = torch.load(out / "chief-final.pt", weights_only=True)
    evaluated = json.loads((out / "chief.json").read_text())
    assert saved["version"] == evaluated["version"] > 0
    net = build_model(64, seed=1)
    net.load_state_dict(saved["model"])
    assert accuracy(net, build_data(0)[1]) >= 0.9
    # the servers are stopped once the chief is done, and no process of the job is left
    servers = client.await_workers(cluster["ps"], wait_for_completion=True, timeout_seconds=60)
    assert [w["status"] for w in servers["workers"]] in (["exited"], ["released"])
    pids = [w.pid for w in client.get(cluster["job"]).worker_list]
    assert len(pids) == 4 and all(pids)
    until(lambda: all(not running(p) for p in pids if p), 30, "the job's processes to end")
