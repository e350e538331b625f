"""A model's parameters: declared on the command line or in JSON, and a training
request's values checked against them (pure), each problem naming ``params.NAME``; the
CLI's registry verbs refuse bad flags in one line naming the flag, before any request."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.cli.main import controller_app, run_app
from tidal.wire.registry import ParamError, ParamSpec, check_params, parse_param_flag

SPECS = [
    parse_param_flag("epochs:int=10[1,100]"),
    parse_param_flag("lr:float=0.1[0.0001,]"),
    parse_param_flag("optimizer:str=sgd{sgd,adam}"),
    parse_param_flag("shuffle:bool=true"),
]


def test_flags_declare_typed_parameters_with_ranges_and_choices() -> None:
    epochs, lr, optimizer, shuffle = SPECS
    assert (epochs.type, epochs.default, epochs.min, epochs.max) == ("int", 10, 1, 100)
    assert (lr.type, lr.default, lr.min, lr.max) == ("float", 0.1, 0.0001, None)
    assert (optimizer.default, optimizer.choices) == ("sgd", ["sgd", "adam"])
    assert shuffle.default is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epochs", "expected NAME:TYPE=DEFAULT"),
        ("epochs:long=1", "type must be int, float, str or bool"),
        ("epochs:int=0[1,100]", "must be ≥ 1"),
        ("epochs:int=5[10,1]", "min 10.0 is above max 1.0"),
        ("flag:bool=true[0,1]", "min and max apply to int and float"),
        ("epochs:int=1{a,b}", "choices apply to str"),
        ("opt:str=rmsprop{sgd,adam}", "expected one of sgd, adam"),
    ],
)
def test_a_bad_declaration_says_what_was_expected(text: str, message: str) -> None:
    with pytest.raises((ValueError, ValidationError), match=message):
        parse_param_flag(text)


def test_values_are_typed_defaults_filled_and_every_problem_named() -> None:
    values = check_params(SPECS, {"epochs": "20", "lr": 1, "shuffle": "false"})
    assert values == {"epochs": 20, "lr": 1.0, "optimizer": "sgd", "shuffle": False}
    assert isinstance(values["epochs"], int) and isinstance(values["lr"], float)
    with pytest.raises(ParamError) as info:
        check_params(
            SPECS,
            {"epochs": 2.5, "lr": "nan", "optimizer": 3, "shuffle": 1, "momentum": 0.9},
        )
    assert dict(info.value.problems) == {
        "params.momentum": "unknown parameter (the model declares epochs, lr, optimizer, shuffle)",
        "params.epochs": "expected an integer, got 2.5",
        "params.lr": "expected a finite number, got 'nan'",
        "params.optimizer": "expected text, got 3",
        "params.shuffle": "expected true or false, got 1",
    }
    with pytest.raises(ParamError, match=r"params.epochs: expected an integer, got a boolean"):
        check_params([ParamSpec(name="epochs", type="int", default=1)], {"epochs": True})


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["model", "register", "m", "--entry", "t.py", "--param", "epochs"], "--param"),
        (["model", "register", "m", "--entry", "t.py", "--tag", "team"], "--tag"),
        (["model", "register", "Bad Name", "--entry", "t.py"], "NAME"),
        (["dataset", "delete", "digits:zero"], "NAME[:VERSION]"),
        (["train", "m", "--set", "epochs"], "--set"),
        (["model", "alias", "m", "champion", "0"], "'version'"),
    ],
)
def test_bad_registry_flags_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], names: str
) -> None:
    code = run_app(controller_app, [*argv, "--data-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tidal: ") and names in err, err
