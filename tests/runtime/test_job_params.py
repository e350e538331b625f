"""``tidal.params()``: the job's parameters typed by the script's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import tidal
from tidal.runtime.job_params import ENV_DATASET, ENV_PARAMS, ParamsError, params


@pytest.fixture(autouse=True)
def _no_job_params(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PARAMS, raising=False)
    monkeypatch.delenv(ENV_DATASET, raising=False)


def test_without_a_job_the_scripts_defaults_hold() -> None:
    p = tidal.params(epochs=10, lr=0.1, dataset="data/digits")
    assert dict(p) == {"epochs": 10, "lr": 0.1}
    assert (p.epochs, p.lr, p.dataset) == (10, 0.1, "data/digits")
    assert tidal.params().dataset is None


def test_the_jobs_values_replace_the_defaults_typed_as_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        ENV_PARAMS,
        json.dumps(
            {"epochs": "3", "lr": 1, "nesterov": "true", "optimizer": "Adam", "extra": [1, 2]}
        ),
    )
    monkeypatch.setenv(ENV_DATASET, "s3://bucket/digits/v2")
    p = params(epochs=10, lr=0.1, nesterov=False, optimizer="SGD", dataset="data/digits")
    assert p.epochs == 3 and type(p.epochs) is int
    assert p.lr == 1.0 and type(p.lr) is float
    assert p.nesterov is True
    assert p.optimizer == "Adam"
    assert p["extra"] == [1, 2]  # no default: as the job gives it
    assert p.dataset == "s3://bucket/digits/v2"


@pytest.mark.parametrize(
    ("given", "defaults", "message"),
    [
        ({"epochs": "ten"}, {"epochs": 10}, r"TIDAL_PARAMS: epochs: expected an integer"),
        ({"epochs": 2.5}, {"epochs": 10}, r"epochs: expected an integer .* got 2.5"),
        ({"lr": True}, {"lr": 0.1}, r"lr: expected a number"),
        ({"optimizer": 3}, {"optimizer": "SGD"}, r"optimizer: expected a string"),
        ({"shuffle": "maybe"}, {"shuffle": True}, r"shuffle: expected true or false"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_parameter(
    monkeypatch: pytest.MonkeyPatch,
    given: dict[str, object],
    defaults: dict[str, Any],
    message: str,
) -> None:
    monkeypatch.setenv(ENV_PARAMS, json.dumps(given))
    with pytest.raises(ParamsError, match=message):
        params(**defaults)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{epochs: 3", r"TIDAL_PARAMS: expected a JSON object"),
        ("[1, 2]", r"TIDAL_PARAMS: expected a JSON object \(name → value\), got list"),
        ('{"dataset": "x"}', r"TIDAL_PARAMS: dataset: .* comes in TIDAL_DATASET"),
    ],
)
def test_a_malformed_variable_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str, message: str
) -> None:
    monkeypatch.setenv(ENV_PARAMS, raw)
    with pytest.raises(ParamsError, match=message):
        params()


def test_an_unknown_attribute_names_the_parameters_there_are() -> None:
    with pytest.raises(AttributeError, match=r"no parameter 'lr' \(the job's parameters: epochs\)"):
        _ = params(epochs=1).lr


def test_a_launched_script_reads_them_without_loading_torch() -> None:
    probe = (
        "import json, sys, tidal\n"
        "p = tidal.params(epochs=10, lr=0.1)\n"
        "print(json.dumps([dict(p), p.dataset, 'torch' in sys.modules]))\n"
    )
    env = dict(os.environ, TIDAL_PARAMS='{"epochs": 4}', TIDAL_DATASET="/data/d1")
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"epochs": 4, "lr": 0.1}, "/data/d1", False]


def test_the_server_and_the_script_name_the_same_variables() -> None:
    # The server (wire layer) sets them and the script (runtime layer) reads them; the two
    # layers cannot import each other's constant, so this holds them together.
    from tidal.runtime import env
    from tidal.wire import registry

    assert (registry.ENV_PARAMS, registry.ENV_DATASET) == (env.ENV_PARAMS, env.ENV_DATASET)
