"""Workers of several GPUs (``resources.gpus: 2``) on a real ``tidal server`` (local
backend, virtual slots): each worker holds two slots of one host and sees both, the job
shrinks and is scaled by whole workers while it trains, and still trains every step; a
multi-role job's wide chief is one replica in every TF_CONFIG."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from sklearn.datasets import load_digits

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client, InvalidRequest
from tidal.wire.schema import WorkerView

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits_mlp.py")
PROBE = str(ROOT / "tests" / "scripts" / "role_probe.py")
EPOCHS = 12
BATCH = 64


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def _digits(epochs: int, result: Path, delay: str) -> list[str]:
    return [sys.executable, DIGITS, "--epochs", str(epochs), "--step-delay", delay,
            "--result", str(result)]  # fmt: skip


def test_workers_of_two_slots_train_and_resize_by_whole_workers(tmp_path: Path) -> None:
    process = start_server(tmp_path, "--interval", "0.2", slots=5)
    data = tmp_path / "data"
    wide_result, narrow_result = tmp_path / "wide.json", tmp_path / "narrow.json"
    try:
        with Client(data_dir=data, timeout=30) as client:
            wide = client.submit(
                {
                    "name": "wide",
                    "command": _digits(EPOCHS, wide_result, "0.05"),
                    "workers": "1:2",
                    "resources": {"gpus": 2},
                }
            )

            def running(job: str) -> list[WorkerView]:
                return [w for w in client.get(job).worker_list if w.state == "running"]

            # Five slots hold two workers of two: the fifth stays free.
            until(lambda: len(running(wide.id)) == 2, 120, "two workers of two slots each")
            workers = running(wide.id)
            assert sorted(s for w in workers for s in w.slots) == [0, 1, 2, 3]
            assert len(client.get(wide.id).slots) == 4
            for worker in workers:
                assert len(worker.slots) == 2 and worker.slot == worker.slots[0]
                # The process is told both of its slots (on GPUs: CUDA_VISIBLE_DEVICES=i,j).
                env = _environ(worker.pid or 0)
                assert env["TIDAL_SLOT"] == f"{worker.host}:{worker.slots[0]},{worker.slots[1]}"

            # Three one-slot workers fit only if the wide job gives up a whole worker.
            narrow = client.submit(
                {
                    "name": "narrow",
                    "command": _digits(2, narrow_result, "0"),
                    "workers": 3,
                    "resources": {"gpus": 0},
                }
            )
            until(
                lambda: len(running(wide.id)) == 1 and len(running(narrow.id)) == 3,
                120,
                "the wide job down to one worker, the narrow one running",
            )
            (kept,) = running(wide.id)
            assert len(kept.slots) == 2 and len(client.get(wide.id).slots) == 2
            # Its events count workers, their data slots.
            shrinks = [
                e.message
                for e in client.events(wide.id)
                if e.kind == "rescale" and e.data == {"from": 4, "to": 2}
            ]
            assert shrinks == ["2 → 1 worker(s)"]

            # Scaled by workers, not slots: one worker is two slots, three are too many.
            assert client.scale(wide.id, 1).state in ("running", "rescaling")
            with pytest.raises(InvalidRequest) as refused:
                client.scale(wide.id, 3)
            assert refused.value.problems == [("workers", "must be within [1, 2] for role worker")]

            assert client.wait(narrow.id, timeout=300).state == "succeeded"
            assert client.wait(wide.id, timeout=300).state == "succeeded"
            assert len(running(wide.id)) == 0
        # Every step of every epoch trained once, across the resizes.
        samples = len(load_digits().target)
        train = samples - math.ceil(samples * 0.2)
        outcome = json.loads(wide_result.read_text())
        assert outcome["steps"] == EPOCHS * math.ceil(train / BATCH)
        assert outcome["accuracy"] >= 0.9
    finally:
        stop_server(process)


def test_a_tf_job_whose_chief_holds_two_slots_lists_every_replica_once(tmp_path: Path) -> None:
    """A chief of two GPUs beside two one-GPU workers: the chief holds two slots of the
    host, each replica gets its TF_CONFIG with one address per replica (not per slot)."""
    process = start_server(tmp_path, "--interval", "0.2", slots=4)
    out = tmp_path / "tf"
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:

            def role(name: str, replicas: int, gpus: int) -> dict[str, object]:
                return {
                    "name": name,
                    "command": [sys.executable, PROBE, "tf", str(out), "3"],
                    "replicas": replicas,
                    "resources": {"gpus": gpus},
                    "launcher": "tf",
                }

            job = client.submit(
                {"name": "tf", "roles": [role("chief", 1, 2), role("worker", 2, 1)]}
            )
            assert client.wait(job.id, timeout=180).state == "succeeded"
            detail = client.get(job.id)
    finally:
        stop_server(process)
    chief = next(w for w in detail.worker_list if w.role == "chief")
    workers = [w for w in detail.worker_list if w.role == "worker"]
    assert len(chief.slots) == 2 and [len(w.slots) for w in workers] == [1, 1]
    assert sorted(s for w in detail.worker_list for s in w.slots) == [0, 1, 2, 3]
    configs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(configs) == ["chief-0", "worker-0", "worker-1"]
    for name, config in configs.items():
        assert [len(config["cluster"][k]) for k in ("chief", "worker")] == [1, 2], name
        assert config["task"] == {"type": name.split("-")[0], "index": int(name.split("-")[1])}
