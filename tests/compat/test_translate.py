"""Kubeflow manifests (real-looking ones, under manifests/) translated field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.compat import load_file, spec_from_document, translate_manifest
from tidal.model import Launcher, RestartKind, Role, job_from_spec

HERE = Path(__file__).parent / "manifests"


def roles(name: str) -> tuple[dict[str, Role], list[tuple[str, str]], Any]:
    spec, warnings = load_file(HERE / name)
    job = job_from_spec(spec)
    return {r.name: r for r in job.roles}, warnings, job


def test_tfjob_with_chief_ps_and_workers() -> None:
    by_name, warnings, job = roles("tfjob-ps.yaml")
    assert job.name == "dist-mnist" and dict(job.labels) == {"team": "vision"}
    assert list(by_name) == ["chief", "ps", "worker"]
    chief, ps, worker = by_name["chief"], by_name["ps"], by_name["worker"]
    script = ("python", "/var/tf_dist_mnist/dist_mnist.py")
    assert chief.command == (*script, "--train_steps=200")  # command + args
    assert ps.command == script
    assert dict(chief.env) == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert chief.working_dir == "/var/tf_dist_mnist"
    assert (chief.resources.cpus, chief.resources.memory, chief.resources.gpus) == (2.0, 2**31, 0)
    assert ps.resources.cpus == 0.5  # a request of 500m, no limit
    assert worker.resources.gpus == 1
    assert (ps.replicas.min, ps.replicas.max) == (2, 2)
    assert (worker.replicas.min, worker.replicas.max) == (4, 4)
    assert chief.restart.policy is RestartKind.ON_FAILURE
    assert ps.restart.policy is RestartKind.NEVER
    assert worker.restart.policy is RestartKind.EXIT_CODE
    assert chief.restart.max_restarts == 4  # runPolicy.backoffLimit
    assert {r.launcher for r in job.roles} == {Launcher.TF}
    assert [r.ends_job for r in job.roles] == [True, False, False]  # the chief's success
    assert dict(job.placement.labels) == {"pool": "cpu"}
    worker_pod = "spec.tfReplicaSpecs.Worker.template"
    container = f"{worker_pod}.spec.containers[0]"
    assert {p for p, _ in warnings} == {
        "metadata.namespace",
        "spec.runPolicy.cleanPodPolicy",
        "spec.tfReplicaSpecs.Chief.template.spec.nodeSelector",
        "spec.tfReplicaSpecs.Chief.template.spec.containers[0].image",
        "spec.tfReplicaSpecs.Chief.template.spec.containers[0].imagePullPolicy",
        "spec.tfReplicaSpecs.PS.template.spec.containers[0].image",
        f"{worker_pod}.metadata",
        f"{worker_pod}.spec.volumes",
        f"{container}.image",
        f"{container}.volumeMounts",
        f"{container}.securityContext",
    }
    paths = dict(warnings)
    assert paths.pop("spec.tfReplicaSpecs.Chief.template.spec.nodeSelector") == (
        "absent: this role also runs on hosts with {'pool': 'cpu'} (one set per job)"
    )
    assert all(m.startswith("ignored: ") for m in paths.values())


def test_elastic_pytorchjob_becomes_an_elastic_torchrun_worker_role() -> None:
    by_name, warnings, job = roles("pytorchjob-elastic.yaml")
    (worker,) = by_name.values()
    assert worker.name == "worker" and worker.launcher is Launcher.TORCHRUN
    # 2 nodes of 2 processes (1..3 nodes) with 2 GPUs per node: replicas of 1 GPU each.
    assert (worker.replicas.min, worker.replicas.max, worker.replicas.initial) == (2, 6, 4)
    assert worker.resources.gpus == 1 and worker.resources.memory == 8 * 2**30
    assert worker.restart.max_restarts == 100  # elasticPolicy.maxRestarts
    assert dict(worker.env) == {"LOGLEVEL": "INFO"}
    assert worker.command[:3] == ("python", "-m", "torch.distributed.run")
    assert worker.command[-1] == "/workspace/data/tiny-imagenet-200"
    assert dict(job.placement.labels) == {"accelerator": "nvidia-a100"}
    paths = dict(warnings)
    container = "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0]"
    assert "POD_IP" in paths[f"{container}.env[1].valueFrom"]
    assert "spec.elasticPolicy.rdzvBackend" in paths
    assert paths["spec.elasticPolicy.nProcPerNode"].startswith("2 processes per node")


def test_v1beta2_pytorchjob_with_a_master() -> None:
    by_name, warnings, _ = roles("pytorchjob-master.yaml")
    assert list(by_name) == ["master", "worker"]
    master, worker = by_name["master"], by_name["worker"]
    assert master.command == ("python", "/opt/mnist/src/mnist.py", "--backend", "gloo")
    assert worker.command == master.command
    assert worker.restart.policy is RestartKind.ON_FAILURE  # PyTorchJob's default
    assert (master.ends_job, worker.ends_job) == (True, False)
    assert master.resources.gpus == 0  # no GPU asked for
    assert len(warnings) == 2  # the two images


def test_trainjob_with_inline_trainer() -> None:
    by_name, warnings, job = roles("trainjob.yaml")
    (node,) = by_name.values()
    assert node.name == "node" and node.launcher is Launcher.TORCHRUN
    assert node.command == ("torchrun", "/workspace/mnist.py", "--epochs", "3")
    assert (node.replicas.min, node.replicas.max) == (3, 3)
    assert (node.resources.gpus, node.resources.cpus) == (1, 4.0)
    assert dict(node.env) == {"NCCL_DEBUG": "WARN"}
    assert dict(job.placement.labels) == {"nvidia": "t4"}
    assert {p for p, _ in warnings} == {
        "spec.podSpecOverrides[0].tolerations",
        "spec.trainer.image",
    }


def test_a_tidal_spec_is_not_a_manifest() -> None:
    spec, warnings = spec_from_document({"name": "x", "command": "python t.py"})
    assert warnings == [] and spec.command == ["python", "t.py"]


def _tfjob(worker: dict[str, Any], **spec: Any) -> dict[str, Any]:
    base = {
        "replicas": 2,
        "template": {
            "spec": {"containers": [{"name": "tensorflow", "command": ["python", "t.py"]}]}
        },
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "bad"},
        "spec": {"tfReplicaSpecs": {"Worker": {**base, **worker}}, **spec},
    }


W = "spec.tfReplicaSpecs.Worker"
C = f"{W}.template.spec.containers[0]"


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({**_tfjob({}), "kind": "MPIJob"}, "kind: unknown kind 'MPIJob'"),
        (
            {**_tfjob({}), "apiVersion": "kubeflow.org/v2"},
            "apiVersion: unknown apiVersion 'kubeflow.org/v2' for TFJob",
        ),
        (_tfjob({"replicas": -1}), f"{W}.replicas: expected an integer >= 0 (got -1)"),
        (_tfjob({"replicas": "2"}), f"{W}.replicas: expected an integer >= 0 (got '2')"),
        (
            _tfjob({"restartPolicy": "Sometimes"}),
            f"{W}.restartPolicy: expected one of Never, OnFailure, Always, ExitCode "
            "(got 'Sometimes')",
        ),
        (
            _tfjob({"template": {"spec": {"containers": [{"name": "tensorflow", "image": "x"}]}}}),
            f"{C}.command: required: tidal runs no container images",
        ),
        (_tfjob({"template": {"spec": {}}}), f"{W}.template.spec.containers: required"),
        (
            _tfjob(
                {
                    "template": {
                        "spec": {
                            "containers": [
                                {"command": ["a"], "resources": {"limits": {"cpu": "lots"}}}
                            ]
                        }
                    }
                }
            ),
            f"{C}.resources.limits.cpu: not a CPU quantity (got 'lots'",
        ),
        (
            _tfjob(
                {
                    "template": {
                        "spec": {
                            "containers": [
                                {"command": ["a"], "resources": {"limits": {"nvidia.com/gpu": 1.5}}}
                            ]
                        }
                    }
                }
            ),
            f"{C}.resources.limits.nvidia.com/gpu: expected an integer >= 0 (got 1.5)",
        ),
        (
            _tfjob(
                {
                    "template": {
                        "spec": {
                            "containers": [
                                {"command": ["a"], "env": [{"name": "1X", "value": "v"}]}
                            ]
                        }
                    }
                }
            ),
            f"{W} (env): not valid variable names",
        ),
        ({**_tfjob({}), "metadata": {"name": "Bad_Name"}}, "metadata.name: must be 1-63 of a-z"),
        (
            {
                **_tfjob({}),
                "spec": {
                    "tfReplicaSpecs": {"Launcher": _tfjob({})["spec"]["tfReplicaSpecs"]["Worker"]}
                },
            },
            "spec.tfReplicaSpecs.Launcher: unknown replica type "
            "(a TFJob has Chief, Master, PS, Worker, Evaluator)",
        ),
        ({**_tfjob({}), "spec": "x"}, "spec: expected a mapping (got 'x')"),
        (_tfjob({}, successPolicy="Whenever"), "spec.successPolicy: expected '' or AllWorkers"),
    ],
)
def test_bad_manifests_name_the_field_path(manifest: dict[str, Any], expected: str) -> None:
    from tidal.spec import SpecError

    with pytest.raises(SpecError) as info:
        translate_manifest(manifest)
    assert expected in info.value.summary()


def test_two_elastic_roles_are_refused_naming_them() -> None:
    from tidal.spec import SpecError

    with pytest.raises(SpecError) as info:
        spec_from_document(
            {
                "name": "x",
                "roles": [
                    {"name": "a", "command": "a", "replicas": "1:2"},
                    {"name": "b", "command": "b", "replicas": "1:3"},
                ],
            }
        )
    assert info.value.problems[0][0] == "roles[1].replicas"


def test_every_problem_is_reported_at_once() -> None:
    from tidal.spec import SpecError

    manifest = _tfjob({"replicas": -1, "restartPolicy": "Sometimes"})
    manifest["metadata"] = {}
    with pytest.raises(SpecError) as info:
        translate_manifest(manifest)
    assert [p for p, _ in info.value.problems] == [
        "metadata.name",
        f"{W}.replicas",
        f"{W}.restartPolicy",
    ]


def test_trainjob_needs_a_known_runtime_and_an_inline_command() -> None:
    from tidal.spec import SpecError

    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {
            "runtimeRef": {"name": "jax-distributed"},
            "trainer": {"image": "x", "numNodes": 0},
        },
    }
    with pytest.raises(SpecError) as info:
        translate_manifest(manifest)
    paths = [p for p, _ in info.value.problems]
    assert paths == ["spec.runtimeRef.name", "spec.trainer.command", "spec.trainer.numNodes"]


def test_replicas_asking_one_label_with_two_values_are_refused() -> None:
    from tidal.spec import SpecError

    manifest = _tfjob(
        {"template": {"spec": {"nodeSelector": {"gpu": "t4"}, "containers": [{"command": ["a"]}]}}}
    )
    manifest["spec"]["tfReplicaSpecs"]["PS"] = {
        "template": {"spec": {"nodeSelector": {"gpu": "a100"}, "containers": [{"command": ["b"]}]}}
    }
    with pytest.raises(SpecError) as info:
        translate_manifest(manifest)
    assert info.value.problems == [
        (
            "spec.tfReplicaSpecs.PS.template.spec.nodeSelector.gpu",
            "'a100' differs from 't4' asked by another replica: "
            "tidal places a whole job by one set of host labels",
        )
    ]


def test_trainjob_takes_its_runtime_from_a_local_file() -> None:
    # The runtime's node container and mlPolicy are the defaults; the inline trainer's
    # command and args replace the runtime's, its env is merged in by name.
    spec, warnings = load_file(HERE / "trainjob.yaml", [HERE / "torch-distributed-runtime.yaml"])
    (node,) = job_from_spec(spec).roles
    job = job_from_spec(spec)
    assert node.launcher is Launcher.TORCHRUN
    assert node.command == ("torchrun", "/workspace/mnist.py", "--epochs", "3")
    assert (node.replicas.min, node.replicas.max) == (3, 3), "the trainer's numNodes wins"
    assert (node.resources.gpus, node.resources.cpus) == (1, 4.0)
    assert dict(node.env) == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1"}
    assert dict(job.placement.labels) == {"nvidia": "t4", "pool": "train"}
    paths = {p for p, _ in warnings}
    node_path = "runtimes.torch-distributed.spec.template.spec.replicatedJobs[1]"
    assert f"{node_path}.template.spec.template.spec.containers[0].image" in paths
    assert "runtimes.torch-distributed.spec.template.spec.replicatedJobs[0]" in paths


def test_a_trainjob_with_only_a_runtime_reference_runs_the_runtime() -> None:
    from tidal.compat.runtime import runtimes_by_name

    runtime_file = HERE / "torch-distributed-runtime.yaml"
    import yaml

    runtimes = runtimes_by_name([(str(runtime_file), yaml.safe_load(runtime_file.read_text()))])
    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "bare"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    spec, _ = translate_manifest(manifest, runtimes=runtimes)
    (node,) = job_from_spec(spec).roles
    assert node.command == ("torchrun", "/workspace/train.py")
    assert (node.replicas.min, node.resources.cpus) == (2, 2.0)
    assert dict(node.env) == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"}


def test_runtime_files_that_do_not_fit_name_the_file_and_field(tmp_path: Path) -> None:
    from tidal.spec import SpecError

    other = tmp_path / "other.yaml"
    other.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
        "metadata: {name: mpi-distributed}\nspec: {template: {spec: {replicatedJobs: []}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_file(HERE / "trainjob.yaml", [other])
    assert info.value.problems == [
        (
            "spec.runtimeRef.name",
            "runtime 'torch-distributed' is not among those given (mpi-distributed)",
        )
    ]
    with pytest.raises(SpecError) as info:
        load_file(HERE / "trainjob.yaml", [HERE / "tfjob-ps.yaml"])
    ((path, message),) = info.value.problems
    assert path == "runtime" and "kind: expected ClusterTrainingRuntime" in message
    assert str(HERE / "tfjob-ps.yaml") in message
    with pytest.raises(SpecError) as info:
        load_file(HERE / "tfjob-ps.yaml", [other])
    assert info.value.problems == [("runtime", "only a TrainJob names a training runtime")]
    broken = tmp_path / "torch.yaml"
    broken.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainingRuntime\n"
        "metadata: {name: torch-distributed}\n"
        "spec: {mlPolicy: {numNodes: 0}, template: {spec: {replicatedJobs: [{name: x}]}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_file(HERE / "trainjob.yaml", [broken])
    assert [p for p, _ in info.value.problems] == [
        "runtimes.torch-distributed.spec.mlPolicy.numNodes",
        "runtimes.torch-distributed.spec.template.spec.replicatedJobs",
    ]
