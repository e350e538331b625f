"""The registry over the API: datasets measured at registration, models checked, a model
trained with checked parameters, and each bad input refused naming its field with
nothing stored. A real server on 127.0.0.1 over a real SQLite store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.controller.conftest import Served
from tidal.controller.support import LOCAL
from tidal.model import JobState
from tidal.wire.registry import ENV_DATASET, ENV_PARAMS, MODEL_LABEL

PARAMS: list[dict[str, Any]] = [
    {"name": "epochs", "type": "int", "default": 3, "min": 1, "max": 100},
    {"name": "lr", "type": "float", "default": 0.1, "min": 0.0001, "max": 1},
    {"name": "optimizer", "type": "str", "default": "sgd", "choices": ["sgd", "adam"]},
    {"name": "shuffle", "type": "bool", "default": True},
]


def api(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=10
    )


@pytest.fixture
def registered(served: Served, tmp_path: Path) -> tuple[Served, Path]:
    """A dataset folder registered as ``digits`` and a model ``mlp`` training on it, on a
    server whose workers see its files (as the local backend's do)."""
    served.backend.capabilities = replace(LOCAL, shared_files=True)  # type: ignore[attr-defined]
    data = tmp_path / "digits"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_bytes(b"1,2\n")
    (data / "sub" / "b.csv").write_bytes(b"3,4,5\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    with api(served) as http:
        r = http.post("/datasets", json={"name": "digits", "location": str(data)})
        assert r.status_code == 201, r.text
        r = http.post(
            "/models",
            json={
                "name": "mlp",
                "code": str(code),
                "entry_point": "train.py",
                "params": PARAMS,
                "dataset": "digits",
                "tags": {"team": "vision"},
            },
        )
        assert r.status_code == 201, r.text
    return served, code


def test_a_dataset_version_is_measured_and_numbered(
    registered: tuple[Served, Path], tmp_path: Path
) -> None:
    served, _ = registered
    digest = hashlib.sha256()
    for name, content in (("a.csv", b"1,2\n"), ("sub/b.csv", b"3,4,5\n")):
        digest.update(name.encode() + b"\0" + content)
    with api(served) as http:
        (version,) = http.get("/datasets/digits").json()["versions"]
        assert (version["version"], version["size"]) == (1, 10)
        assert version["checksum"] == digest.hexdigest()
        r = http.post("/datasets", json={"name": "digits", "location": "s3://bucket/digits"})
        assert r.status_code == 201
        assert (r.json()["version"], r.json()["size"], r.json()["checksum"]) == (2, None, None)
        r = http.post("/datasets", json={"name": "x", "location": str(tmp_path / "none")})
        assert r.status_code == 422
        assert r.json()["detail"][0]["path"] == "location"
        assert [d["name"] for d in http.get("/datasets").json()] == ["digits"]


def test_a_model_whose_files_or_dataset_are_missing_is_refused(
    registered: tuple[Served, Path], tmp_path: Path
) -> None:
    served, code = registered
    base = {"name": "other", "code": str(code), "entry_point": "train.py"}
    with api(served) as http:
        for change, field in (
            ({"entry_point": "missing.py"}, "entry_point"),
            ({"code": str(tmp_path / "nowhere")}, "code"),
            ({"dataset": "unknown"}, "dataset"),
        ):
            r = http.post("/models", json={**base, **change})
            assert r.status_code == 422, r.text
            assert [p["path"] for p in r.json()["detail"]] == [field]
        bad_param = {"name": "lr", "type": "float", "default": 5, "max": 1}
        r = http.post("/models", json={**base, "params": [bad_param]})
        assert r.status_code == 422 and "params" in r.text
        assert r.json()["detail"][0]["loc"][:2] == ["body", "params"]
        assert [m["name"] for m in http.get("/models").json()] == ["mlp"]
        assert http.post("/models", json={**base, "name": "mlp"}).status_code == 409


def _jobs(served: Served) -> list[str]:
    return [j.id for j in served.store.list_jobs()]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"params": {"epochs": "many"}}, "params.epochs", "expected an integer"),
        ({"params": {"epochs": 0}}, "params.epochs", "must be ≥ 1"),
        ({"params": {"lr": 2.5}}, "params.lr", "must be ≤ 1"),
        ({"params": {"optimizer": "rmsprop"}}, "params.optimizer", "one of sgd, adam"),
        ({"params": {"shuffle": "maybe"}}, "params.shuffle", "true or false"),
        ({"params": {"momentum": 0.9}}, "params.momentum", "unknown parameter"),
        ({"dataset": "imagenet"}, "dataset", "no dataset imagenet"),
        ({"dataset": "digits:7"}, "dataset", "no dataset digits:7"),
        ({"workers": "8:1"}, "workers", ""),
    ],
)
def test_bad_training_input_is_refused_naming_the_field_with_nothing_stored(
    registered: tuple[Served, Path], body: dict[str, Any], field: str, message: str
) -> None:
    served, _ = registered
    with api(served) as http:
        r = http.post("/models/mlp/train", json=body)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["path"] == field
    assert message in problem["msg"]
    assert _jobs(served) == []  # a run's row needs its job: none was stored either


def test_training_a_model_whose_entry_point_vanished_is_refused(
    registered: tuple[Served, Path],
) -> None:
    served, code = registered
    (code / "train.py").unlink()
    with api(served) as http:
        r = http.post("/models/mlp/train", json={})
        assert r.status_code == 422
        assert [p["path"] for p in r.json()["detail"]] == ["entry_point"]
        assert http.post("/models/none/train", json={}).status_code == 404
    assert _jobs(served) == []


def test_a_trained_job_carries_its_parameters_and_becomes_a_version(
    registered: tuple[Served, Path],
) -> None:
    served, code = registered
    with api(served) as http:
        r = http.post(
            "/models/mlp/train",
            json={"params": {"epochs": "7", "lr": 0.5, "shuffle": "false"}, "workers": "1:2"},
        )
        assert r.status_code == 201, r.text
        job = served.store.get_job(r.json()["id"])
        assert job is not None
        spec = job.spec
        assert json.loads(spec.env[ENV_PARAMS]) == {
            "epochs": 7,
            "lr": 0.5,
            "optimizer": "sgd",
            "shuffle": False,
        }
        assert spec.env[ENV_DATASET] == str(code.parent / "digits")
        assert spec.command == ["python", "train.py"] and spec.working_dir == str(code)
        assert job.labels[MODEL_LABEL] == "mlp"
        assert (job.min_slots, job.max_slots) == (1, 2)
        # While the job runs, the dataset version it reads cannot be deleted.
        r = http.delete("/datasets/digits", params={"version": 1})
        assert r.status_code == 409 and job.id in r.json()["detail"]

        served.store.add_metrics(job.id, 5, {"accuracy": 0.9})
        served.store.update_job(job.id, state=JobState.RUNNING)
        served.store.update_job(job.id, state=JobState.SUCCEEDED)
        (version,) = http.get("/models/mlp/versions").json()
        assert version["version"] == 1 and version["job_id"] == job.id
        assert version["dataset"] == "digits:1" and version["metrics"] == {"accuracy": 0.9}
        assert version["params"]["epochs"] == 7
        assert version["checkpoint"].startswith(str(served.data_dir / "models" / "mlp"))
        assert http.get("/datasets/digits").json()["versions"][0]["used_by"] == ["mlp:1"]

        r = http.put("/models/mlp/aliases/champion", json={"version": 1})
        assert r.status_code == 200 and r.json()["aliases"] == {"champion": 1}
        r = http.put("/models/mlp/aliases/champion", json={"version": 2})
        assert r.status_code == 422 and r.json()["detail"][0]["path"] == "version"

        r = http.delete("/datasets/digits", params={"version": 1})
        assert r.status_code == 409
        assert "version 1 trained model version mlp:1" in r.json()["detail"]
        r = http.delete("/datasets/digits")
        assert r.status_code == 409
        assert len(http.get("/datasets/digits").json()["versions"]) == 1
