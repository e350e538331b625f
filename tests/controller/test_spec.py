"""Job spec validation: every problem listed, each with its field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.spec import SpecError, load_spec_file, parse_spec, parse_spec_yaml, parse_workers_range


def problems(data: object) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return dict(info.value.problems)


def test_minimal_spec_gets_defaults() -> None:
    spec = parse_spec({"name": "mnist", "command": "python train.py --lr '0.1 0.2'"})
    assert spec.command == ["python", "train.py", "--lr", "0.1 0.2"]
    assert (spec.workers.min, spec.workers.max_workers, spec.workers.initial_workers) == (1, 1, 1)
    assert spec.priority == 5000
    assert spec.restart.max_restarts == 3


def test_workers_shorthand_and_memory_units() -> None:
    spec = parse_spec(
        {"name": "a", "command": ["x"], "workers": "2:8", "resources": {"memory": "4Gi"}}
    )
    assert (spec.workers.min, spec.workers.max, spec.workers.initial_workers) == (2, 8, 8)
    assert spec.resources.memory == 4 * 2**30
    assert parse_workers_range(3) == {"min": 3, "max": 3}


def test_min_above_max_names_both_fields() -> None:
    found = problems({"name": "a", "command": "x", "workers": {"min": 4, "max": 2}})
    assert found == {"workers.min": "must be ≤ workers.max (got 4 > 2)"}


def test_every_problem_is_listed_with_its_path() -> None:
    found = problems(
        {
            "name": "Bad Name",
            "command": ["python", 3],
            "workers": {"min": 4, "max": 2, "typo": 1},
            "resources": {"memory": "12Q"},
            "env": {"1BAD": "x"},
            "priority": 0,
            "restart": {"max_restarts": -1},
            "surprise": True,
        }
    )
    assert set(found) == {
        "name",
        "command[1]",
        "workers.typo",
        "workers.min",
        "resources.memory",
        "env",
        "priority",
        "restart.max_restarts",
        "surprise",
    }
    assert found["surprise"] == "unknown field"
    assert found["workers.min"] == "must be ≤ workers.max (got 4 > 2)"


def test_missing_required_fields() -> None:
    assert problems({}) == {"name": "required", "command": "required"}


def test_initial_outside_range() -> None:
    found = problems({"name": "a", "command": "x", "workers": {"min": 2, "max": 4, "initial": 1}})
    assert found == {"workers.initial": "must be ≥ workers.min (got 1 < 2)"}


def test_not_a_mapping() -> None:
    assert list(problems(["a"])) == [""]


def test_yaml_syntax_error_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="invalid YAML at line 2"):
        parse_spec_yaml("name: [a\ncommand: x\n")


def test_load_file_reports_source(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\ncommand: python t.py\nworkers: 5:1\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert str(info.value).startswith(str(path))
    assert info.value.problems == [("workers.min", "must be ≤ workers.max (got 5 > 1)")]
    with pytest.raises(SpecError, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")


def test_launcher_defaults_to_tidal_and_accepts_torchrun() -> None:
    assert parse_spec({"name": "a", "command": "x"}).launcher == "tidal"
    assert parse_spec({"name": "a", "command": "x", "launcher": "torchrun"}).launcher == "torchrun"


def test_an_unknown_launcher_is_refused_by_name() -> None:
    found = problems({"name": "a", "command": "x", "launcher": "mpirun"})
    assert list(found) == ["launcher"]
    assert "'tidal' or 'torchrun'" in found["launcher"]


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"workers": {}}, "workers"),
        ({"workers": {"min": 5, "max": None, "initial": 5}}, "workers.max"),
        ({"workers": {"min": 2, "initial": None}}, "workers.initial"),
        ({"workers": {"max": None}}, "workers.max"),
    ],
)
def test_a_size_written_empty_or_with_a_null_is_refused_naming_it(
    extra: dict[str, object], path: str
) -> None:
    """``workers: {}`` was read as 1:1 and ``max: null`` as ``min``: a size written says
    what it is; leaving it (or a field) out is how to ask for the defaults."""
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "command": ["x"], **extra})
    assert [p for p, _ in err.value.problems] == [path]


def test_a_role_size_written_empty_or_with_a_null_is_refused_naming_it() -> None:
    roles = [
        {"name": "w", "command": ["x"], "replicas": {"max": None}},
        {"name": "ps", "command": ["y"], "replicas": {}},
    ]
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "roles": roles})
    assert [p for p, _ in err.value.problems] == ["roles[0].replicas.max", "roles[1].replicas"]


def test_a_spec_is_written_out_without_nulls_and_read_back_as_it_was() -> None:
    spec = parse_spec({"name": "a", "command": ["x"], "workers": {"min": 2, "initial": 2}})
    written = spec.model_dump(mode="json")
    assert written["workers"] == {"min": 2, "initial": 2}
    assert parse_spec(written) == spec
