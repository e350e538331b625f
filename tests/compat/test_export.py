"""``export_manifest`` writes a job back as a manifest that reads back as the same job."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tidal.compat import load_file, spec_from_document
from tidal.compat.export import export_manifest
from tidal.model import job_from_spec
from tidal.spec import SpecError, parse_spec

HERE = Path(__file__).parent / "manifests"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tfjob-ps.yaml", "tfjob"),
        ("pytorchjob-elastic.yaml", "pytorchjob"),
        ("pytorchjob-master.yaml", "pytorchjob"),
        ("trainjob.yaml", "trainjob"),
    ],
)
def test_a_manifest_read_exported_and_read_again_is_the_same_job(name: str, kind: str) -> None:
    spec, _ = load_file(HERE / name)
    manifest, warnings = export_manifest(spec, kind, image="registry/train:1")
    assert warnings == []
    # Through YAML text, as `tidal export` writes it.
    again, read_warnings = spec_from_document(yaml.safe_load(yaml.safe_dump(manifest)))
    assert job_from_spec(again) == job_from_spec(spec)
    assert all(p.endswith("image") for p, _ in read_warnings)


def test_a_one_role_tidal_job_as_a_pytorchjob() -> None:
    spec = parse_spec(
        {
            "name": "mnist",
            "command": "python train.py --lr 0.1",
            "env": {"SEED": "1"},
            "working_dir": "/srv/mnist",
            "workers": "1:4",
            "resources": {"cpus": 2, "memory": "4Gi"},
            "target": {"labels": {"zone": "a"}},
            "restart": {"max_restarts": 7},
        }
    )
    manifest, warnings = export_manifest(spec, "pytorchjob")
    assert warnings == [("roles.worker.launcher", "'tidal' becomes 'torchrun' in a PyTorchJob")]
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"
    assert manifest["spec"]["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 4}
    assert manifest["spec"]["runPolicy"] == {"backoffLimit": 7}
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "OnFailure"
    assert worker["template"]["spec"]["nodeSelector"] == {"zone": "a"}
    (container,) = worker["template"]["spec"]["containers"]
    assert container == {
        "name": "pytorch",
        "command": ["python", "train.py", "--lr", "0.1"],
        "env": [{"name": "SEED", "value": "1"}],
        "workingDir": "/srv/mnist",
        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 2.0, "memory": 4 * 2**30}},
    }
    back, _ = spec_from_document(manifest)
    role, original = job_from_spec(back).roles[0], job_from_spec(spec).roles[0]
    assert (role.command, dict(role.env), role.working_dir) == (
        original.command,
        dict(original.env),
        original.working_dir,
    )
    assert role.replicas == original.replicas and role.resources == original.resources


def test_a_role_a_kind_has_no_replica_type_for_is_refused() -> None:
    spec = parse_spec({"name": "x", "roles": [{"name": "launcher", "command": "mpirun a"}]})
    with pytest.raises(SpecError) as info:
        export_manifest(spec, "tfjob")
    assert info.value.problems[0][0] == "roles.launcher"
