"""WMLA's entry points: the parameter readers, and a FabricModel script trained under a
real ``tidal run`` while it is resized."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.runtime.launcher import Launch
from tidal.compat.wmla import (
    FabricModel,
    getEpoch,
    getLearningRate,
    getOptimizer,
    getTrainBatchSize,
    getTrainData,
)
from tidal.runtime.job_params import ENV_DATASET, ENV_PARAMS, ParamsError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wmla_digits.py"


@pytest.fixture(autouse=True)
def _no_job_params(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PARAMS, raising=False)
    monkeypatch.delenv(ENV_DATASET, raising=False)


def test_readers_give_the_scripts_defaults_without_a_job() -> None:
    model = nn.Linear(4, 2)
    assert (getEpoch(5), getTrainBatchSize(32), getLearningRate(0.2)) == (5, 32, 0.2)
    optimizer = getOptimizer(model, lr=0.3)
    assert type(optimizer) is torch.optim.SGD
    assert optimizer.param_groups[0]["lr"] == 0.3
    assert getTrainData("data/digits") == "data/digits"


def test_readers_take_the_forms_values(monkeypatch: pytest.MonkeyPatch) -> None:
    form = {"epochs": "7", "batch_size": 128, "optimizer": "adamw", "learning_rate": 0.002}
    monkeypatch.setenv(ENV_PARAMS, json.dumps({**form, "weight_decay": 0.05}))
    monkeypatch.setenv(ENV_DATASET, "/datasets/digits/3")
    model = nn.Linear(4, 2)
    assert (getEpoch(), getTrainBatchSize(), getLearningRate()) == (7, 128, 0.002)
    optimizer = getOptimizer(model)
    assert type(optimizer) is torch.optim.AdamW
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (0.002, 0.05)
    assert {id(p) for p in group["params"]} == {id(p) for p in model.parameters()}
    assert getTrainData("data/digits") == "/datasets/digits/3"


def test_readers_refuse_bad_values_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PARAMS, json.dumps({"optimizer": "Adamant", "epochs": "many"}))
    with pytest.raises(ParamsError, match=r"optimizer: unknown optimizer 'Adamant' \(.*Adam, "):
        getOptimizer(nn.Linear(2, 2))
    with pytest.raises(ParamsError, match=r"TIDAL_PARAMS: epochs: expected an integer"):
        getEpoch()
    monkeypatch.setenv(ENV_PARAMS, json.dumps({"optimizer": "SGD", "momentum": -1}))
    with pytest.raises(ParamsError, match=r"optimizer: SGD refused .*momentum"):
        getOptimizer(nn.Linear(2, 2))
    with pytest.raises(ParamsError, match=r"TIDAL_DATASET: the job names no dataset"):
        getTrainData()


def test_an_optimizer_over_another_model_is_refused() -> None:
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"optimizer: it holds none of the model's parameters"):
        FabricModel(nn.Linear(2, 2), lambda: (None, None), nn.MSELoss(), other)  # type: ignore[arg-type, return-value]


@pytest.mark.slow
def test_fabric_model_script_reaches_95_percent_while_resized(tmp_path: Path) -> None:
    # The form's parameters reach the script through the readers (Adam, 12 epochs); the
    # job is resized 2 -> 3 -> 1 workers while it trains. The grow is asked for at step 2
    # and the run is long enough that the newcomer's start (an interpreter importing torch
    # beside two training workers: 4 s on a quiet 2-core machine, several times that on a
    # loaded one) lands before the last epoch.
    result = tmp_path / "result.json"
    params = {"epochs": 12, "batch_size": 64, "optimizer": "Adam", "lr": 0.003}
    launch = Launch(
        [
            "--workers",
            "1:3",
            "--initial",
            "2",
            "--resize-at",
            "2:3,60:1",
            "--",
            str(EXAMPLE),
            "--result",
            str(result),
        ],
        home=tmp_path,
        env={ENV_PARAMS: json.dumps(params)},
    )
    try:
        assert launch.finish(timeout=280) == 0, launch.output()
    finally:
        launch.close()
    final = json.loads(result.read_text())
    assert final["val_accuracy"] > 0.95, final
    assert final["epoch"] == 11.0  # the form's 12 epochs, not the script's default of 8
    out = launch.output()
    assert "generation 1 (resize)" in out and "generation 2 (resize)" in out, out
    assert final["workers"] == 1.0
