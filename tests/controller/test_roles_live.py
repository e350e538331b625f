"""Multi-role jobs on a real ``tidal server`` (local backend): a parameter-server job of a
fixed ``ps`` role and an elastic ``worker`` role training digits; a ``tf`` job whose every
replica gets its TF_CONFIG; restart policies ``Never`` and ``ExitCode``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tests.processes import running
from tidal.client import Client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROBE = str(ROOT / "tests" / "scripts" / "role_probe.py")
PS_DIGITS = str(ROOT / "examples" / "ps_digits.py")
THRESHOLD = 0.9
TERMINAL = ("succeeded", "failed", "cancelled")


def _logs(data: Path, job_id: str) -> str:
    logs = sorted((data / "jobs" / job_id / "logs").glob("worker-*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs)


def _role(name: str, mode: str, out: Path, replicas: int, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "command": [sys.executable, PROBE, mode, str(out), "3"],
        "replicas": replicas,
        "resources": {"gpus": 0},
        **extra,
    }


def test_tf_config_and_restart_policies(tmp_path: Path) -> None:
    process = start_server(tmp_path, "--interval", "0.2", slots=6)
    data = tmp_path / "data"
    tf_out, never_out, code_out = tmp_path / "tf", tmp_path / "never", tmp_path / "code"
    try:
        with Client(data_dir=data, timeout=30) as client:
            tf = client.submit(
                {
                    "name": "tf-probe",
                    "roles": [
                        _role("chief", "tf", tf_out, 1, launcher="tf"),
                        _role("worker", "tf", tf_out, 2, launcher="tf"),
                    ],
                }
            )
            never = client.submit(
                {
                    "name": "never",
                    "roles": [
                        _role("worker", "never", never_out, 2, launcher="ps", restart="Never")
                    ],
                }
            )
            code = client.submit(
                {
                    "name": "exitcode",
                    "restart": {"max_restarts": 3},
                    "roles": [
                        _role("worker", "exitcode", code_out, 1, launcher="ps", restart="ExitCode")
                    ],
                }
            )
            ids = (tf.id, never.id, code.id)
            until(lambda: all(client.get(i).state in TERMINAL for i in ids), 120, "the three jobs")
            tf_d, never_d, code_d = (client.get(i) for i in ids)
            # A replica's log by role and index, as `kubectl logs job-worker-1` reads it.
            logs = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tidal.cli",
                    "logs",
                    tf.id,
                    "--role",
                    "worker",
                    "--index",
                    "1",
                    "--data-dir",
                    str(data),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            wrong = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tidal.cli",
                    "logs",
                    tf.id,
                    "--role",
                    "ps",
                    "--data-dir",
                    str(data),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
    finally:
        stop_server(process)
    worker_1 = next(w for w in tf_d.worker_list if (w.role, w.index) == ("worker", 1))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [f"[{worker_1.worker_id}] worker-1 started"]
    assert wrong.returncode == 2 and "--role" in wrong.stderr and "chief, worker" in wrong.stderr
    # Replicas per role and the conditions the job went through, as Kubeflow shows them.
    assert [(r.name, r.replicas, r.succeeded, r.failed) for r in tf_d.roles] == [
        ("chief", 1, 1, 0),
        ("worker", 2, 0, 0),  # they serve until the chief's success stops them
    ]
    assert [(c.type, c.status) for c in tf_d.conditions] == [
        ("Created", "True"),
        ("Running", "False"),
        ("Succeeded", "True"),
    ]
    assert [(c.type, c.status) for c in code_d.conditions] == [
        ("Created", "True"),
        ("Running", "False"),
        ("Restarting", "False"),
        ("Failed", "True"),
    ]
    assert code_d.conditions[-1].message == code_d.reason
    assert tf_d.state == "succeeded", (tf_d.reason, _logs(data, tf.id))
    configs = {p.stem: json.loads(p.read_text()) for p in tf_out.glob("*.json")}
    assert sorted(configs) == ["chief-0", "worker-0", "worker-1"]
    clusters = [c["cluster"] for c in configs.values()]
    assert all(c == clusters[0] for c in clusters)  # the same cluster for every replica
    assert sorted(clusters[0]) == ["chief", "worker"]
    assert (len(clusters[0]["chief"]), len(clusters[0]["worker"])) == (1, 2)
    addresses = clusters[0]["chief"] + clusters[0]["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    for name, c in configs.items():
        kind, index = name.split("-")
        assert c["task"] == {"type": kind, "index": int(index)} and c["environment"] == "cloud"

    assert never_d.state == "failed"
    assert never_d.reason == "roles.worker[1] exited with status 3 (restart policy Never)"
    assert never_d.restarts == 0

    assert code_d.state == "failed", (code_d.reason, _logs(data, code.id))
    # SIGKILL is retryable (one restart), the exit 1 that follows is the program's verdict.
    assert code_d.restarts == 1
    assert code_d.reason == "roles.worker[0] exited with status 1 (restart policy ExitCode)"


def test_a_parameter_server_job_trains_digits_and_its_servers_stop(tmp_path: Path) -> None:
    process = start_server(tmp_path, "--interval", "0.2", slots=3)
    data = tmp_path / "data"
    out = tmp_path / "out"
    command = [sys.executable, PS_DIGITS, "--out", str(out), "--epochs", "6"]
    try:
        with Client(data_dir=data, timeout=30) as client:
            job = client.submit(
                {
                    "name": "ps-digits",
                    "env": {"TIDAL_PS_MODE": "async", "TIDAL_PS_PEER_TIMEOUT": "3"},
                    "roles": [
                        {
                            "name": "ps",
                            "command": command,
                            "replicas": 1,
                            "launcher": "ps",
                            "resources": {"gpus": 0},
                        },
                        {
                            "name": "worker",
                            "command": command,
                            "replicas": "1:2",
                            "launcher": "ps",
                            "resources": {"gpus": 0},
                        },
                    ],
                }
            )
            until(lambda: client.get(job.id).state in TERMINAL, 240, "the ps job")
            detail = client.get(job.id)
            pids = [w.pid for w in detail.worker_list if w.pid is not None]
            # The server was stopped once the workers finished: no process of the job runs.
            until(lambda: not any(running(pid) for pid in pids), 30, "the job's processes to end")
    finally:
        stop_server(process)
    assert detail.state == "succeeded", (detail.reason, _logs(data, job.id))
    results = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert [r["worker"] for r in results] == ["worker-0", "worker-1"]
    assert all(r["accuracy"] >= THRESHOLD for r in results), results
    # Worker ids are unique across roles: one server and two workers, each with its role.
    assert sorted(w.worker_id for w in detail.worker_list) == [0, 1, 2], detail.worker_list
    assert sorted((w.role, w.index) for w in detail.worker_list) == [
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
    ]
    # The server ends on the stop either way (exit 0 or released): never as a failure.
    assert [(r.name, r.active, r.failed) for r in detail.roles] == [("ps", 0, 0), ("worker", 0, 0)]
    assert detail.roles[1].succeeded == 2
    # Nothing is shown running; the server left on the job's SIGTERM.
    assert {w.state for w in detail.worker_list} <= {"exited", "released"}, detail.worker_list
    assert (data / "jobs" / job.id / "ps-addresses" / "ps-0.addr").exists()


def test_a_parameter_server_killed_mid_training_comes_back_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """SIGKILL the job's only server mid-training: the restart policy starts it again on
    its slot, it restores its shard from the latest checkpoint, the workers wait for it,
    reconnect and finish, and the job succeeds with one restart spent."""
    process = start_server(tmp_path, "--interval", "0.2", slots=3)
    data = tmp_path / "data"
    out = tmp_path / "out"
    command = [sys.executable, PS_DIGITS, "--out", str(out), "--epochs", "5"]
    command += ["--step-delay", "0.01"]
    env = {
        "TIDAL_PS_MODE": "async",
        "TIDAL_PS_PEER_TIMEOUT": "3",
        "TIDAL_PS_RECOVER_TIMEOUT": "120",
        "TIDAL_PS_CHECKPOINT_EVERY": "10",
    }
    role = {"command": command, "launcher": "ps", "resources": {"gpus": 0}}
    try:
        with Client(data_dir=data, timeout=30) as client:
            job = client.submit(
                {
                    "name": "ps-restore",
                    "env": env,
                    "restart": {"max_restarts": 2},
                    "roles": [
                        {"name": "ps", "replicas": 1, **role},
                        {"name": "worker", "replicas": 2, **role},
                    ],
                }
            )
            shards = data / "jobs" / job.id / "checkpoints" / "ps"

            def trained(worker: str) -> int:
                path = out / f"{worker}.jsonl"
                return len(path.read_text().splitlines()) if path.exists() else 0

            until(
                lambda: trained("worker-0") >= 40 and any(shards.glob("shard0-*.pt")),
                180,
                "the workers to train and the server to checkpoint",
            )
            (server,) = [w for w in client.get(job.id).worker_list if w.role == "ps"]
            assert server.pid is not None
            os.kill(server.pid, 9)
            until(lambda: client.get(job.id).state in TERMINAL, 240, "the ps job")
            detail = client.get(job.id)
            events = [(e.kind, e.message) for e in client.events(job.id)]
    finally:
        stop_server(process)
    assert detail.state == "succeeded", (detail.reason, events, _logs(data, job.id))
    assert detail.restarts == 1, events
    servers = [w for w in detail.worker_list if w.role == "ps"]
    assert len(servers) == 2 and {w.index for w in servers} == {0}  # one more, same shard
    log = "\n".join(p.read_text() for p in (data / "jobs" / job.id / "logs").glob("*.log"))
    assert "restored" in log, log[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert [r["worker"] for r in results] == ["worker-0", "worker-1"]
    assert all(r["accuracy"] >= THRESHOLD for r in results), results
    # Each worker lost at most the gradient in flight, and waited for the server.
    assert all(r["stats"]["recoveries"] >= 1 for r in results), results
