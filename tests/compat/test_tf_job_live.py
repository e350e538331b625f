"""A real TensorFlow job, written as a TFJob manifest, trained by a real ``tidal server``.

The script (``examples/tf_digits.py``) knows nothing of tidal: it reads ``TF_CONFIG`` and
trains with ``MultiWorkerMirroredStrategy``. The ``tf`` launcher must give every replica
the same cluster and its own task, so the two processes form one TensorFlow cluster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

pytest.importorskip("tensorflow", reason="the TensorFlow job needs tensorflow-cpu (dev extra)")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tf_digits.py"
TERMINAL = ("succeeded", "failed", "cancelled")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _manifest(out: Path) -> dict[str, object]:
    def replica(args: list[str]) -> dict[str, object]:
        return {
            "replicas": 1,
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
        "spec": {"tfReplicaSpecs": {"Chief": replica(args), "Worker": replica(args)}},
    }


def test_an_unmodified_tensorflow_job_trains_across_its_tf_config(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    process = start_server(tmp_path, slots=2)
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
    # One cluster of two tasks: the chief wrote it, and the strategy saw both replicas.
    assert summary["task"] == "chief:0"
    assert summary["replicas"] == 2
    cluster = summary["cluster"]
    assert sorted(cluster) == ["chief", "worker"]
    assert len(cluster["chief"]) == len(cluster["worker"]) == 1
    assert len({*cluster["chief"], *cluster["worker"]}) == 2, cluster
    assert summary["accuracy"] > 0.9, summary
    losses = summary["loss"]
    assert losses[-1] < losses[0] / 5, losses
