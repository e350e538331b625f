"""A real TensorFlow job, written as a TFJob manifest, trained by a real ``tidal server``.

The script (``examples/tf_digits.py``) knows nothing of tidal: it reads ``TF_CONFIG`` and,
with Chief, PS and Worker replicas, trains with ``ParameterServerStrategy``: the parameter
server and the workers serve until stopped, the chief drives the training. The ``tf``
launcher must give every replica the same cluster and its own task, and the job must end
when the chief does (TFJob's success policy), stopping the others.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

# Looked up, not imported: the job imports it in its own processes, and importing it here
# would install absl's log handler in the test process, whose close (when uvicorn or
# anything else reconfigures logging) closes pytest's captured stderr for good.
_NO_TENSORFLOW = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="the TensorFlow job needs tensorflow-cpu (dev extra)",
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tf_digits.py"
TERMINAL = ("succeeded", "failed", "cancelled")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), _NO_TENSORFLOW]


def _manifest(out: Path) -> dict[str, object]:
    def replica(args: list[str], replicas: int = 1) -> dict[str, object]:
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "tensorflow",
                            "command": [sys.executable, str(SCRIPT)],
                            "args": args,
                            "env": [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}],
                        }
                    ]
                }
            },
        }

    args = ["--epochs", "6", "--out", str(out)]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "tf-digits"},
        "spec": {
            "tfReplicaSpecs": {
                "Chief": replica(args),
                "PS": replica([]),
                "Worker": replica([], replicas=2),
            }
        },
    }


def test_an_unmodified_tensorflow_job_trains_across_its_tf_config(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    process = start_server(tmp_path, slots=4)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            job = client.submit(_manifest(out)).id
            until(lambda: client.get(job).state in TERMINAL, 300, "the TensorFlow job ends")
            view = client.get(job)
            logs = client.logs(job, tail=40)
    finally:
        stop_server(process)
    assert view.state == "succeeded", (view.state, view.reason, logs)
    summary = json.loads(out.read_text())
    # One cluster of four tasks, each at its own address; the chief trained on both workers.
    assert summary["task"] == "chief:0"
    assert summary["strategy"] == "parameter-server"
    assert summary["replicas"] == 2
    cluster = summary["cluster"]
    assert {role: len(tasks) for role, tasks in cluster.items()} == {
        "chief": 1,
        "ps": 1,
        "worker": 2,
    }
    addresses = [a for tasks in cluster.values() for a in tasks]
    assert len(set(addresses)) == 4, cluster
    assert summary["accuracy"] > 0.9, summary
    losses = summary["loss"]
    assert losses[-1] < losses[0] / 5, losses
