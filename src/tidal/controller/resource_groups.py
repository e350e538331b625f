"""Resource groups across hosts, from the server's config (``tidal server --config``).

An admin groups the hosts a backend reports (this machine, Ray's nodes) by name or by
label, and gives each group's hosts a number of slots computed from what each host
reports::

    groups:
      - name: a100
        labels: {gpu: a100}
        slots: ngpus
      - name: cpu
        hosts: [build-1, build-2]
        slots: ncpus // 2

A host joins the first group that names it (``hosts``, shell patterns allowed) or whose
``labels`` it all carries; a group with neither takes every host not taken yet. A host of
no group keeps what its backend said. ``slots`` is a formula of ``ngpus`` (the host's
GPUs) and ``ncpus`` (its CPUs): whole numbers, ``+ - * //``, parentheses, ``min(..)`` and
``max(..)``; it is read by a small grammar over :mod:`ast`, never evaluated as Python.
"""

from __future__ import annotations

import ast
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidal.controller.cluster import ClusterHost
from tidal.documents import load_yaml
from tidal.documents_bounds import DocumentError

__all__ = [
    "ClusterConfig",
    "ClusterConfigError",
    "GroupConfig",
    "apply_groups",
    "evaluate_slots",
    "load_cluster_config",
    "parse_slots",
]

#: What a host reports that a formula may use.
VARIABLES = ("ngpus", "ncpus")
#: A formula longer than this is refused (a config is written by a person).
MAX_FORMULA_CHARS = 200

_OPERATORS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
}


class ClusterConfigError(ValueError):
    """A server config that cannot be used: every problem with its field path."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__(
            "; ".join(f"{path}: {message}" if path else message for path, message in self.problems)
        )


def parse_slots(formula: str) -> ast.expr:
    """The syntax tree of a slot formula, checked against the grammar of the module
    docstring; ``ValueError`` saying what is not allowed."""
    if len(formula) > MAX_FORMULA_CHARS:
        raise ValueError(f"a formula of at most {MAX_FORMULA_CHARS} characters")
    try:
        tree = ast.parse(formula.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"not a formula (got {formula!r}; e.g. ngpus, ncpus // 2)") from None
    _check(tree)
    return tree


def _check(node: ast.expr) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int or node.value < 0:
            raise ValueError(f"numbers must be whole and not negative (got {node.value!r})")
    elif isinstance(node, ast.Name):
        if node.id not in VARIABLES:
            raise ValueError(f"unknown name {node.id!r}; a formula may use {', '.join(VARIABLES)}")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _OPERATORS:
            raise ValueError("only + - * // are allowed")
        _check(node.left)
        _check(node.right)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in ("min", "max"):
            raise ValueError("the only functions are min and max")
        if node.keywords or len(node.args) < 2:
            raise ValueError(f"{node.func.id} takes two or more numbers")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise ValueError(f"{node.func.id} takes numbers")
            _check(arg)
    else:
        raise ValueError(f"not allowed in a formula: {ast.unparse(node)!r}")


def evaluate_slots(tree: ast.expr, values: Mapping[str, int]) -> int:
    """The value of a checked formula (:func:`parse_slots`) for one host; never below 0."""
    return max(0, _value(tree, values))


def _value(node: ast.expr, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return int(values[node.id])
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, values), _value(node.right, values)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left // right if right else 0  # no CPUs to share: no slots
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        numbers = [_value(a, values) for a in node.args]
        return min(numbers) if node.func.id == "min" else max(numbers)
    raise ValueError(f"not a checked formula: {ast.unparse(node)!r}")


_NAME = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class GroupConfig(BaseModel):
    """One resource group: which hosts, and how many slots each gets."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: _NAME
    #: Host names (shell patterns: ``gpu-*``) that belong to it.
    hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=10_000
    )
    #: Labels a host must all carry to belong to it.
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    #: Slots per host, a formula of ``ngpus`` and ``ncpus`` (``None``: as reported).
    slots: str | None = None

    @field_validator("slots")
    @classmethod
    def _formula(cls, value: str | None) -> str | None:
        if value is not None:
            parse_slots(value)
        return value

    def takes(self, host: ClusterHost) -> bool:
        """Whether ``host`` belongs to this group."""
        if not self.hosts and not self.labels:
            return True
        named = any(fnmatch.fnmatchcase(host.name, pattern) for pattern in self.hosts)
        labelled = bool(self.labels) and all(
            host.labels.get(k) == v for k, v in self.labels.items()
        )
        return named or labelled


class ClusterConfig(BaseModel):
    """The server's config file: its resource groups."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    groups: list[GroupConfig] = Field(default_factory=list, max_length=1000)

    @field_validator("groups")
    @classmethod
    def _unique(cls, groups: list[GroupConfig]) -> list[GroupConfig]:
        names = [g.name for g in groups]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"group names must be unique (repeated: {', '.join(repeated)})")
        return groups


def host_values(host: ClusterHost) -> dict[str, int]:
    """What ``host`` reports, as a formula reads it: its GPUs (its slots when they are
    GPUs, else 0) and its CPUs (those it reports, else its slots when they are CPUs)."""
    ngpus = host.slots if host.gpu else 0
    ncpus = math.floor(host.cpus) if host.cpus is not None else (0 if host.gpu else host.slots)
    return {"ngpus": ngpus, "ncpus": ncpus}


def apply_groups(hosts: Sequence[ClusterHost], config: ClusterConfig) -> tuple[ClusterHost, ...]:
    """``hosts`` as ``config`` groups them: each in the first group that takes it, with
    that group's name and its slots formula worked out over what the host reports."""
    out = []
    for host in hosts:
        group = next((g for g in config.groups if g.takes(host)), None)
        if group is None:
            out.append(host)
            continue
        slots = host.slots
        if group.slots is not None:
            slots = evaluate_slots(parse_slots(group.slots), host_values(host))
        out.append(replace(host, group=group.name, slots=slots))
    return tuple(out)


def load_cluster_config(path: Path) -> ClusterConfig:
    """Read and check a server config file; :class:`ClusterConfigError` naming each
    field that is wrong (``groups.1.slots: unknown name 'ngpu' ...``)."""
    try:
        data: Any = load_yaml(path.read_bytes())
    except OSError as exc:
        raise ClusterConfigError([("", f"cannot read {path}: {exc.strerror or exc}")]) from None
    except DocumentError as exc:
        raise ClusterConfigError([("", f"{path} is not valid YAML: {exc}")]) from None
    if data is None:
        data = {}
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(p) for p in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append((where, message))
        raise ClusterConfigError(problems) from None
