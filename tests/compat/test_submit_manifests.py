"""Manifests through ``POST /jobs``, the SDK and ``tidal submit`` / ``tidal export``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import yaml

from tests.controller.conftest import Served
from tests.controller.live import start_server, stop_server, until
from tidal.backends.base import ONE_GROUP
from tidal.client import Client, InvalidRequest
from tidal.model import Launcher

HERE = Path(__file__).parent / "manifests"
TERMINAL = ("succeeded", "failed", "cancelled")


def _post_yaml(served: Served, text: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/yaml"}
    return httpx.post(f"{served.url}/jobs", content=text.encode(), headers=headers, timeout=5)


def test_a_manifest_this_server_cannot_run_is_refused_naming_each_role(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A backend that runs one group per job refuses a multi-role job.
    monkeypatch.setattr(served.backend, "capabilities", ONE_GROUP, raising=False)
    response = _post_yaml(served, (HERE / "tfjob-ps.yaml").read_text())
    assert response.status_code == 422
    problems = [(d["path"], d["msg"]) for d in response.json()["detail"]]
    assert ("roles.ps.launcher", "the 'tf' launcher is not available on this server") in problems
    assert problems[0] == (
        "roles",
        "a job with several roles (chief, ps, worker) is not available on this server",
    )
    assert served.store.list_jobs() == []


def test_a_bad_manifest_names_its_field_path_and_stores_nothing(served: Served) -> None:
    manifest = yaml.safe_load((HERE / "pytorchjob-elastic.yaml").read_text())
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1
    with pytest.raises(InvalidRequest) as info:
        served.client().submit(manifest)
    assert info.value.problems == [
        ("spec.pytorchReplicaSpecs.Worker.replicas", "expected an integer >= 0 (got -1)")
    ]
    assert served.store.list_jobs() == []


def test_an_accepted_manifest_answers_with_its_warnings(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An elastic PyTorchJob is accepted; each field tidal cannot honour comes back as a
    # warning.
    job = served.client().submit(HERE / "pytorchjob-elastic.yaml")
    assert (job.name, job.min_slots, job.max_slots) == ("elastic-imagenet", 2, 6)
    paths = {w.path for w in job.warnings}
    assert "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].image" in paths
    assert "spec.elasticPolicy.rdzvBackend" in paths
    assert job.spec is not None and job.spec["roles"][0]["launcher"] == "torchrun"
    (record,) = served.store.list_jobs()
    assert record.job.role.launcher is Launcher.TORCHRUN
    headers = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/yaml"}
    checked = httpx.post(
        f"{served.url}/jobs/validate",
        content=(HERE / "trainjob.yaml").read_bytes(),
        headers=headers,
        timeout=5,
    ).json()
    assert checked["valid"] and checked["problems"] == []
    assert {w["path"] for w in checked["warnings"]} == {
        "spec.podSpecOverrides[0].tolerations",
        "spec.trainer.image",
    }
    assert len(served.store.list_jobs()) == 1, "validating submits nothing"


def test_a_manifest_whose_node_selector_matches_no_host_waits_saying_why(
    served: Served,
) -> None:
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "needs-t4"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "nodeSelector": {"nvidia": "t4"},
                            "containers": [{"name": "pytorch", "command": ["python", "train.py"]}],
                        }
                    },
                }
            }
        },
    }
    client = served.client()
    job = client.submit(manifest)
    served.controller.tick()
    view = client.get(job.id)
    assert (view.state, view.reason) == ("queued", "queued: no host has label nvidia=t4")
    assert served.backend.calls == []


def _tidal(
    data: Path, verb: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", verb, "--data-dir", str(data), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=dict(os.environ, COLUMNS="250"),
    )


@pytest.mark.slow
def test_the_cli_against_a_live_server(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--interval", "0.2", slots=4)
    data = tmp_path / "data"
    try:
        greedy = tmp_path / "greedy.yaml"
        greedy.write_text(
            (HERE / "tfjob-ps.yaml").read_text().replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 8")
        )
        refused = _tidal(data, "submit", str(greedy))
        assert refused.returncode == 2, refused.stderr
        assert (
            "roles.worker.resources.gpus: 8 GPUs per replica, all on one host: the hosts "
            "this job may run on have at most 4 slot(s)"
        ) in " ".join(refused.stderr.split())
        # The translation's warnings are printed before the server's answer.
        assert "warning: spec.tfReplicaSpecs.Worker.template.spec.volumes" in refused.stderr
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            (HERE / "trainjob.yaml").read_text().replace("numNodes: 3", "numNodes: many")
        )
        refused = _tidal(data, "submit", str(bad))
        assert refused.returncode == 2
        assert "spec.trainer.numNodes: expected an integer >= 1 (got 'many')" in refused.stderr
        listed = _tidal(data, "list", "--json")
        assert json.loads(listed.stdout) == []

        # Arena's flag form; the job is then written back as a PyTorchJob.
        arena = _tidal(
            data,
            "submit",
            "--name",
            "arena",
            "--workers",
            "2",
            "--min-workers",
            "1",
            "--max-workers",
            "3",
            "--gpus",
            "0",
            "--json",
            "--",
            sys.executable,
            "-c",
            "pass",
            cwd=tmp_path,
        )
        assert arena.returncode == 0, arena.stderr
        job = json.loads(arena.stdout)
        assert (job["min_slots"], job["max_slots"]) == (1, 3)
        assert job["spec"]["workers"] == {"min": 1, "max": 3, "initial": 2}
        assert job["spec"]["resources"]["gpus"] == 0
        out = tmp_path / "arena.yaml"
        exported = _tidal(
            data, "export", job["id"], "--as", "pytorchjob", "--image", "reg/t:1", "-o", str(out)
        )
        assert exported.returncode == 0, exported.stderr
        assert "'tidal' becomes 'torchrun'" in exported.stderr
        manifest = yaml.safe_load(out.read_text())
        assert manifest["spec"]["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 3}
        worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
        assert worker["replicas"] == 2
        command = worker["template"]["spec"]["containers"][0]["command"]
        assert command == [sys.executable, "-c", "pass"]
        wrong = _tidal(data, "export", job["id"], "--as", "mpijob", "--image", "reg/t:1")
        assert wrong.returncode == 2 and "--as" in wrong.stderr

        # A job written with `roles:` (one elastic tidal role) runs like a one-role job:
        # each worker gets the job's env with the role's over it, in the role's working dir.
        spec = tmp_path / "roles.yaml"
        spec.write_text(
            yaml.safe_dump(
                {
                    "name": "with-roles",
                    "env": {"SHARED": "job", "ONLY_JOB": "1"},
                    "roles": [
                        {
                            "name": "worker",
                            "command": [
                                sys.executable,
                                "-c",
                                "import os; print('seen', os.environ['SHARED'], "
                                "os.environ['ONLY_JOB'], os.path.basename(os.getcwd()))",
                            ],
                            "env": {"SHARED": "role"},
                            "working_dir": "work",
                            "replicas": "1:2",
                            "resources": {"gpus": 0},
                        }
                    ],
                }
            )
        )
        (tmp_path / "work").mkdir()
        submitted = _tidal(data, "submit", str(spec), "--json")
        assert submitted.returncode == 0, submitted.stderr
        roles_job = json.loads(submitted.stdout)["id"]
        with Client(data_dir=data, timeout=30) as client:

            def ended(ref: str) -> bool:
                return client.get(ref).state in TERMINAL

            for ref in (job["id"], roles_job):
                until(partial(ended, ref), 90, f"{ref} to end")
                assert client.get(ref).state == "succeeded", client.get(ref).reason
            logs = client.logs(roles_job)
        assert logs.count("seen role 1 work") == 2, logs
        shown = _tidal(data, "get", roles_job)
        assert f"worker (tidal): {sys.executable} -c" in shown.stdout
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("flags", "hint"),
    [
        (["--workers", "1:3", "--max-workers", "4"], "--workers"),
        (["--workers", "5", "--min-workers", "1", "--max-workers", "4"], "--workers"),
        (["--min-workers", "4", "--max-workers", "2"], "--min-workers"),
        (["--runtime", "torch.yaml"], "--runtime"),
    ],
)
def test_arena_flags_that_do_not_fit_name_the_flag(
    tmp_path: Path, flags: list[str], hint: str
) -> None:
    result = _tidal(tmp_path / "data", "submit", "--name", "x", *flags, "--", "python", "t.py")
    assert result.returncode == 2
    assert hint in result.stderr


def test_a_trainjob_with_a_runtime_file_through_the_cli(tmp_path: Path) -> None:
    # A runtime that is not the one the TrainJob names is refused before any server is
    # asked; the refusal names the field and the runtimes given.
    other = tmp_path / "mpi.yaml"
    other.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
        "metadata: {name: mpi-distributed}\nspec: {template: {spec: {replicatedJobs: []}}}\n"
    )
    result = _tidal(
        tmp_path / "data", "submit", str(HERE / "trainjob.yaml"), "--runtime", str(other)
    )
    assert result.returncode == 2
    assert "spec.runtimeRef.name" in result.stderr and "mpi-distributed" in result.stderr
