"""Hostile spec documents: each one crashed, froze or fooled the API before it was hardened.

Each case is a request body, its content type and the field path the refusal must name
(``""`` for a problem of the document as a whole). Shared by the spec fuzzer, the API tests
and the live-server test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

JSON = "application/json"
YAML = "application/yaml"


@dataclass(frozen=True)
class Hostile:
    """One hostile request body."""

    name: str
    body: bytes
    content_type: str
    #: The path a problem must name, or begin with (``command`` for ``command[4999]``);
    #: None when the body is refused before it is parsed (413).
    path: str | None

    def named_by(self, problems: list[tuple[str, str]]) -> bool:
        """Whether a problem names this case's path (or a path inside it)."""
        if self.path is None:
            return False
        return any(p == self.path or (self.path and p.startswith(self.path)) for p, _ in problems)

    def __repr__(self) -> str:  # short ids in test output
        return self.name


def _json(name: str, data: object, path: str) -> Hostile:
    return Hostile(name, json.dumps(data).encode(), JSON, path)


def _yaml(name: str, text: str, path: str) -> Hostile:
    return Hostile(name, text.encode(), YAML, path)


def alias_bomb(levels: int, width: int = 9) -> str:
    """``levels`` anchored lists, each of ``width`` aliases to the one before: a few hundred
    bytes that expand to ``9 ** levels`` strings."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"name: b\ncommand: [x]\nenv: *a{levels - 1}\n"])


BASE = {"name": "hostile", "command": ["python", "train.py"]}

CASES: list[Hostile] = [
    Hostile(
        "lone-surrogate-command",
        b'{"name":"s","command":"/bin/\\ud800true","workers":"5:6"}',
        JSON,
        "command",
    ),
    Hostile(
        "lone-surrogate-arg",
        b'{"name":"s","command":["/bin/\\udfff"]}',
        JSON,
        "command[0]",
    ),
    _json("nul-in-arg", {**BASE, "command": ["a\x00b"]}, "command[0]"),
    _yaml("alias-bomb-314B", alias_bomb(7), "a2"),
    _yaml("alias-bomb-360B", alias_bomb(8), "a2"),
    _yaml("recursive-alias", "name: &a [*a]\ncommand: [x]\n", "name[0]"),
    _yaml("recursive-alias-map", "name: a\ncommand: [x]\nenv: &e {A: *e}\n", "env.A"),
    Hostile("1MB-command", json.dumps({**BASE, "command": "x " * 500_000}).encode(), JSON, None),
    _json("60KB-command", {**BASE, "command": "x " * 30_000}, "command"),
    _json("5000-arguments", {**BASE, "command": ["x"] * 5000}, "command"),
    Hostile("json-5000-deep", b"[" * 5000 + b"]" * 5000, JSON, ""),
    Hostile("json-object-5000-deep", b'{"a":' * 5000 + b"1" + b"}" * 5000, JSON, ""),
    _yaml("yaml-3000-deep", "[" * 3000 + "]" * 3000, "[0]"),
    _yaml("yaml-deep-labels", "name: a\ncommand: [x]\nlabels: " + "[" * 40 + "]" * 40, "labels"),
    _json("workers-2^63", {**BASE, "workers": 2**63}, "workers.min"),
    _json("workers-max-2^63", {**BASE, "workers": {"max": 2**63}}, "workers.max"),
    _json("priority-2^64", {**BASE, "priority": 2**64}, "priority"),
    _json("steps-2^63", {**BASE, "checkpoint_every_steps": 2**63}, "checkpoint_every_steps"),
    _json("restarts-2^63", {**BASE, "restart": {"max_restarts": 2**63}}, "restart.max_restarts"),
    _json("unicode-digit-key", {**BASE, "\u00b2": 1}, "\u00b2"),
    _json("arabic-indic-workers", {**BASE, "workers": "\u0661:\u0668"}, "workers"),
    _json("full-width-workers", {**BASE, "workers": "\uff14"}, "workers"),
    _json("full-width-memory", {**BASE, "resources": {"memory": "\uff14Gi"}}, "resources.memory"),
    _json("400-digit-memory", {**BASE, "resources": {"memory": "9" * 400}}, "resources.memory"),
    Hostile(
        "400-digit-memory-number",
        b'{"name":"a","command":["x"],"resources":{"memory":' + b"9" * 400 + b"}}",
        JSON,
        "resources.memory",
    ),
    _yaml(
        "yaml-400-digit-memory",
        f"name: a\ncommand: [x]\nresources: {{memory: {'9' * 400}}}\n",
        "resources.memory",
    ),
    _yaml(
        "yaml-9e400-memory",
        "name: a\ncommand: [x]\nresources: {memory: 9e400}\n",
        "resources.memory",
    ),
    _json("name-newline", {**BASE, "name": "job\n"}, "name"),
    _json("env-key-newline", {**BASE, "env": {"KEY\n": "v"}}, "env"),
    _yaml("cpus-inf", "name: a\ncommand: [x]\nresources: {cpus: .inf}\n", "resources.cpus"),
    _yaml(
        "checkpoint-seconds-inf",
        "name: a\ncommand: [x]\ncheckpoint_every_seconds: .inf\n",
        "checkpoint_every_seconds",
    ),
    _yaml("cpus-nan", "name: a\ncommand: [x]\nresources: {cpus: .nan}\n", "resources.cpus"),
    Hostile(
        "json-cpus-1e400",
        b'{"name":"a","command":["x"],"resources":{"cpus":1e400}}',
        JSON,
        "resources.cpus",
    ),
    Hostile(
        "json-cpus-nan",
        b'{"name":"a","command":["x"],"resources":{"cpus":NaN}}',
        JSON,
        "resources.cpus",
    ),
    Hostile("json-duplicate-name", b'{"name":"a","name":"b","command":["x"]}', JSON, "name"),
    _yaml("yaml-duplicate-env", "name: a\ncommand: [x]\nenv: {A: '1', A: '2'}\n", "env.A"),
    _yaml("yaml-set-tag", "name: a\ncommand: [x]\nlabels: !!set {a, b}\n", "labels"),
    _yaml("yaml-binary-tag", "name: a\ncommand: !!binary aGVsbG8=\n", "command"),
    _yaml("yaml-python-tag", "name: !!python/object/apply:os.getcwd []\ncommand: [x]\n", "name"),
    _json("true-as-1", {**BASE, "priority": True}, "priority"),
    _json("string-as-7", {**BASE, "priority": "7"}, "priority"),
    _json("memory-true", {**BASE, "resources": {"memory": True}}, "resources.memory"),
    _json("workers-max-true", {**BASE, "workers": {"min": 4, "max": True}}, "workers.max"),
    _json("cpus-string", {**BASE, "resources": {"cpus": "2"}}, "resources.cpus"),
    _json("label-surrogate-key", {**BASE, "labels": {"\ud800": "x"}}, "labels"),
    _json("huge-env-value", {**BASE, "env": {"A": "v" * 40_000}}, "env.A"),
    Hostile("70KB-yaml", ("name: a\ncommand: [x]\n#" + "x" * 70_000).encode(), YAML, None),
    Hostile("not-a-mapping", b"[1, 2, 3]", JSON, ""),
    Hostile("empty-body", b"", JSON, ""),
    Hostile("invalid-json", b'{"name": ', JSON, ""),
]
