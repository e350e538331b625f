"""Hostile specs: each refused with the field at fault named, never coerced or crashed on."""

from __future__ import annotations

import json
import time

import pytest

from tidal.spec import SpecError, parse_spec, parse_spec_json, parse_spec_yaml

BASE = {"name": "a", "command": ["x"]}


def refused(data: object) -> dict[str, str]:
    """The problems of a spec that must be refused, by path."""
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return dict(info.value.problems)


def refused_yaml(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec_yaml(text)
    return dict(info.value.problems)


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"priority": True}, "priority"),
        ({"priority": "7"}, "priority"),
        ({"priority": 7.0}, "priority"),
        ({"restart": {"max_restarts": "3"}}, "restart.max_restarts"),
        ({"restart": {"max_restarts": False}}, "restart.max_restarts"),
        ({"resources": {"gpus": True}}, "resources.gpus"),
        ({"resources": {"cpus": "2"}}, "resources.cpus"),
        ({"resources": {"cpus": True}}, "resources.cpus"),
        ({"resources": {"memory": True}}, "resources.memory"),
        ({"workers": {"min": True}}, "workers.min"),
        ({"workers": {"min": "2"}}, "workers.min"),
        ({"checkpoint_every_steps": "10"}, "checkpoint_every_steps"),
        ({"checkpoint_every_seconds": "60"}, "checkpoint_every_seconds"),
        ({"name": 7}, "name"),
        ({"labels": {"team": 1}}, "labels.team"),
    ],
)
def test_no_coercion_of_booleans_or_numeric_strings(patch: dict[str, object], path: str) -> None:
    assert path in refused({**BASE, **patch})


def test_workers_max_true_is_blamed_on_workers_max() -> None:
    found = refused({**BASE, "workers": {"min": 4, "max": True}})
    assert list(found) == ["workers.max"]


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"workers": "\uff14"}, "workers"),  # full-width 4
        ({"workers": "\u0661:\u0668"}, "workers"),  # Arabic-Indic 1:8
        ({"workers": "1:\uff18"}, "workers"),
        ({"resources": {"memory": "\uff14Gi"}}, "resources.memory"),
        ({"resources": {"memory": "\u0664Gi"}}, "resources.memory"),
    ],
)
def test_only_ascii_digits_are_numbers(patch: dict[str, object], path: str) -> None:
    assert path in refused({**BASE, **patch})


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"resources": {"cpus": float("inf")}}, "resources.cpus"),
        ({"resources": {"cpus": float("nan")}}, "resources.cpus"),
        ({"checkpoint_every_seconds": float("inf")}, "checkpoint_every_seconds"),
        ({"resources": {"memory": float("inf")}}, "resources.memory"),
        ({"resources": {"memory": 1.5}}, "resources.memory"),
    ],
)
def test_numbers_are_finite(patch: dict[str, object], path: str) -> None:
    assert path in refused({**BASE, **patch})


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"workers": 2**63}, "workers.min"),
        ({"workers": {"min": 1, "max": 2**63}}, "workers.max"),
        ({"workers": {"max": 100_001}}, "workers.max"),
        ({"workers": "1:99999999999999999999"}, "workers.max"),
        ({"workers": "1:" + "9" * 400}, "workers"),
        ({"priority": 2**64}, "priority"),
        ({"restart": {"max_restarts": 2**63}}, "restart.max_restarts"),
        ({"checkpoint_every_steps": 2**63}, "checkpoint_every_steps"),
        ({"resources": {"memory": 2**61}}, "resources.memory"),
        ({"resources": {"memory": "9" * 400}}, "resources.memory"),
        ({"resources": {"memory": "9" * 400 + "Gi"}}, "resources.memory"),
        ({"resources": {"memory": 10**400}}, "resources.memory"),
        ({"resources": {"memory": "2048Pi"}}, "resources.memory"),
        ({"resources": {"cpus": 1e300}}, "resources.cpus"),
        ({"checkpoint_every_seconds": 1e300}, "checkpoint_every_seconds"),
    ],
)
def test_integers_and_numbers_are_bounded(patch: dict[str, object], path: str) -> None:
    assert path in refused({**BASE, **patch})


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"name": "a\n"}, "name"),
        ({"env": {"KEY\n": "v"}}, "env"),
        ({"command": ["/bin/\ud800true"]}, "command[0]"),
        ({"command": "/bin/\ud800true"}, "command"),
        ({"command": ["a\x00b"]}, "command[0]"),
        ({"env": {"K": "\udfff"}}, "env.K"),
        ({"env": {"K": "a\x00"}}, "env.K"),
        ({"labels": {"team": "\ud800"}}, "labels.team"),
        ({"labels": {"\ud800": "x"}}, "labels"),
        ({"labels": {"": "x"}}, "labels"),
        ({"labels": {"a\nb": "x"}}, "labels"),
        ({"working_dir": "/tmp/\x00"}, "working_dir"),
        ({"checkpoint_dir": "\ud800"}, "checkpoint_dir"),
        ({"target": {"group": "g\ud800"}}, "target.group"),
        ({"target": {"labels": {"k": "\x00"}}}, "target.labels.k"),
    ],
)
def test_text_is_safe(patch: dict[str, object], path: str) -> None:
    found = refused({**BASE, **patch})
    assert path in found
    # Problems are shown and sent as JSON: no lone surrogate may leak into them.
    json.dumps(found, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"command": "x " * 20_000}, "command"),
        ({"command": ["x"] * 5000}, "command"),
        ({"command": ["x" * 40_000]}, "command[0]"),
        ({"env": {"K": "v" * 40_000}}, "env.K"),
        ({"env": {f"K{i}": "v" for i in range(1100)}}, "env"),
        ({"env": {"K" * 300: "v"}}, "env"),
        ({"labels": {"team": "v" * 300}}, "labels.team"),
        ({"labels": {"k" * 64: "v"}}, "labels"),
        ({"labels": {f"k{i}": "v" for i in range(300)}}, "labels"),
        ({"working_dir": "/" + "d" * 5000}, "working_dir"),
    ],
)
def test_lengths_are_bounded(patch: dict[str, object], path: str) -> None:
    started = time.process_time()
    assert path in refused({**BASE, **patch})
    assert time.process_time() - started < 2.0


def test_valid_shorthands_still_accepted() -> None:
    spec = parse_spec_yaml(
        "name: a\ncommand: python t.py\nworkers: 1:8\nresources: {memory: 4Gi, cpus: 2}\n"
    )
    assert (spec.workers.min, spec.workers.max) == (1, 8)
    assert spec.resources.memory == 4 * 2**30
    assert spec.resources.cpus == 2.0
    assert parse_spec({**BASE, "workers": 4}).workers.max_workers == 4
    assert parse_spec({**BASE, "workers": "4"}).workers.max_workers == 4
    assert parse_spec({**BASE, "workers": " 2 : 3 "}).workers.max_workers == 3
    assert parse_spec({**BASE, "resources": {"memory": "1.5Gi"}}).resources.memory == 3 * 2**29
    assert parse_spec({**BASE, "resources": {"memory": "512M"}}).resources.memory == 512 * 10**6
    assert parse_spec({**BASE, "resources": {"memory": 1024}}).resources.memory == 1024
    assert parse_spec({**BASE, "resources": {"memory": 2.0**40}}).resources.memory == 2**40
    assert parse_spec({**BASE, "resources": {"memory": 2**60}}).resources.memory == 2**60
    assert parse_spec({**BASE, "workers": {"max": 100_000}}).workers.max == 100_000
    assert parse_spec({**BASE, "env": {"A": "x\ny"}}).env == {"A": "x\ny"}
    assert parse_spec({**BASE, "labels": {"team": "vision", "ib": "yes"}}).labels["ib"] == "yes"


def test_errors_list_every_problem_at_once() -> None:
    found = refused(
        {
            "name": "a\n",
            "command": ["\ud800"],
            "workers": {"min": True, "max": "2"},
            "resources": {"memory": True, "cpus": float("inf")},
        }
    )
    assert set(found) == {
        "name",
        "command[0]",
        "workers.min",
        "workers.max",
        "resources.memory",
        "resources.cpus",
    }


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "a", "name": "b", "command": ["x"]}',
        '{"name": "a", "command": ["x"], "env": {"A": "1", "A": "2"}}',
    ],
)
def test_json_duplicate_keys_are_refused(text: str) -> None:
    with pytest.raises(SpecError, match="duplicate key"):
        parse_spec_json(text)


def test_yaml_duplicate_key_names_the_key_and_its_path() -> None:
    found = refused_yaml("name: a\ncommand: [x]\nenv:\n  A: '1'\n  A: '2'\n")
    assert list(found) == ["env.A"]
    assert "duplicate key" in found["env.A"]


@pytest.mark.parametrize(
    "text",
    [
        "name: a\ncommand: [x]\nlabels: !!set {a, b}\n",
        "name: a\ncommand: !!binary aGVsbG8=\n",
        "name: !!python/object/apply:os.getcwd []\ncommand: [x]\n",
        "name: !custom a\ncommand: [x]\n",
        "name: a\ncommand: [x]\nlabels: !!omap [{a: b}]\n",
    ],
)
def test_yaml_custom_tags_are_refused(text: str) -> None:
    with pytest.raises(SpecError, match="tag"):
        parse_spec_yaml(text)


def test_yaml_infinity_is_refused() -> None:
    found = refused_yaml("name: a\ncommand: [x]\nresources: {cpus: .inf}\n")
    assert "resources.cpus" in found
    found = refused_yaml("name: a\ncommand: [x]\ncheckpoint_every_seconds: .nan\n")
    assert "checkpoint_every_seconds" in found


def alias_bomb(levels: int, width: int = 9) -> str:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"name: b\ncommand: [x]\nenv: *a{levels - 1}\n"])


@pytest.mark.parametrize(
    "text",
    [
        alias_bomb(7),
        alias_bomb(9),
        "name: &a [*a]\ncommand: [x]\n",
        "name: a\ncommand: &c [x, *c]\n",
        "[" * 3000 + "]" * 3000,
        "a:\n" + "".join(" " * i + "- \n" for i in range(1, 200)),
        "{" * 5000,
        "name: a\ncommand: [x]\nlabels: {k: " + "v" * 70_000 + "}\n",
    ],
)
def test_hostile_yaml_is_refused_quickly(text: str) -> None:
    # CPU time of this process, not wall time: a loaded machine must not fail the test, a
    # parser that blows up on the input still does (seconds of CPU, or never returning).
    started = time.process_time()
    with pytest.raises(SpecError):
        parse_spec_yaml(text)
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        '{"a":' * 5000 + "1" + "}" * 5000,
        '{"name": "a", "command": ["x"], "priority": ' + "9" * 5000 + "}",
        '{"name": "a", "command": ["x"], "resources": {"cpus": NaN}}',
        '{"name": "a", "command": ["x"], "resources": {"cpus": 1e400}}',
        '{"name": "a", "command": ["x"], "labels": {"k": "' + "v" * 70_000 + '"}}',
        "",
        "[1,",
    ],
)
def test_hostile_json_is_refused_quickly(text: str) -> None:
    started = time.process_time()
    with pytest.raises(SpecError):
        parse_spec_json(text)
    assert time.process_time() - started < 1.0
