"""The job spec: what a user submits, as a pydantic model with a YAML form.

A spec is accepted whole or refused whole. A refused spec raises :class:`SpecError`, which
lists every problem found, each with the dotted path of the field at fault
(``workers.min: must be ≤ workers.max (got 4 > 2)``), so one round trip fixes them all.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "JobSpec",
    "ResourcesSpec",
    "RestartSpec",
    "SpecError",
    "TargetSpec",
    "WorkersSpec",
    "load_spec_file",
    "locate_problems",
    "parse_memory",
    "parse_spec",
    "parse_spec_yaml",
    "parse_workers_range",
]

#: Job names become part of job ids, directory names and URLs: keep them boring.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.1 without base-60 integers, so ``workers: 1:8`` stays the string ``"1:8"``."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)

DEFAULT_PRIORITY = 5000
MAX_PRIORITY = 1_000_000


class SpecError(ValueError):
    """A spec was refused; ``problems`` lists every ``(field path, message)`` found."""

    def __init__(self, problems: Sequence[tuple[str, str]], source: str | None = None) -> None:
        self.problems: list[tuple[str, str]] = list(problems)
        self.source = source
        super().__init__(self.summary())

    def summary(self) -> str:
        """All problems on one line, each as ``path: message``."""
        text = "; ".join(f"{p}: {m}" if p else m for p, m in self.problems)
        return f"{self.source}: {text}" if self.source else text


def parse_memory(value: str | int) -> int:
    """Bytes from ``4Gi``, ``512M``, ``1024`` and the like; raises ``ValueError`` otherwise."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be ≥ 0")
        return value
    match = _MEMORY_RE.match(value)
    if not match:
        raise ValueError(f"not a memory size (got {value!r}; use e.g. 512Mi, 4Gi, 2G)")
    unit = (match.group(2) or "").lower()
    return int(float(match.group(1)) * _MEMORY_UNITS[unit])


def parse_workers_range(value: str | int) -> dict[str, int]:
    """``"1:8"`` → ``{"min": 1, "max": 8}``; ``"4"`` or ``4`` → a fixed size of 4."""
    if isinstance(value, int):
        return {"min": value, "max": value}
    parts = value.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected N or MIN:MAX (got {value!r})") from None
    if len(numbers) == 1:
        return {"min": numbers[0], "max": numbers[0]}
    if len(numbers) == 2:
        return {"min": numbers[0], "max": numbers[1]}
    raise ValueError(f"expected N or MIN:MAX (got {value!r})")


class _Section(BaseModel):
    # Unknown keys are typos far more often than intent: refuse them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkersSpec(_Section):
    """How many workers (one slot each) the job may run: ``min ≤ initial ≤ max``."""

    min: int = Field(default=1, ge=1)
    #: Defaults to ``min`` (a fixed-size job).
    max: int | None = Field(default=None, ge=1)
    #: Size to start at when slots allow; defaults to ``max``.
    initial: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `workers: 1:8` and `workers: 4` read better in YAML than a mapping.
        if isinstance(data, (str, int)) and not isinstance(data, bool):
            return parse_workers_range(data)
        return data

    @property
    def max_workers(self) -> int:
        """The upper bound, ``min`` when none was given."""
        return self.max if self.max is not None else self.min

    @property
    def initial_workers(self) -> int:
        """The starting size, ``max`` when none was given."""
        return self.initial if self.initial is not None else self.max_workers


class ResourcesSpec(_Section):
    """What one worker needs. A worker holds exactly one slot (one GPU, or one CPU slot)."""

    gpus: int = Field(default=1, ge=0, le=1)
    cpus: float = Field(default=1.0, gt=0)
    #: Bytes, written as ``4Gi``, ``512M`` or a plain number.
    memory: int | None = None

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, (str, int)):
            return parse_memory(value)
        return value


class TargetSpec(_Section):
    """Where the job may run: a resource group and node labels every host must carry."""

    group: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class RestartSpec(_Section):
    """How many worker failures the job survives before it is marked failed."""

    max_restarts: int = Field(default=3, ge=0)


class JobSpec(_Section):
    """A training job as submitted: the command and how elastic it may be."""

    name: str
    #: The program each worker runs; a string is split like a shell would (no expansion).
    command: list[str] = Field(min_length=1)
    working_dir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    #: Higher is more important.
    priority: int = Field(default=DEFAULT_PRIORITY, ge=1, le=MAX_PRIORITY)
    target: TargetSpec = Field(default_factory=TargetSpec)
    restart: RestartSpec = Field(default_factory=RestartSpec)
    checkpoint_dir: str | None = None
    #: Durable checkpoints every N steps (0: off) and every S seconds (0: off); a job whose
    #: workers all die resumes from the latest one.
    checkpoint_every_steps: int = Field(default=0, ge=0)
    checkpoint_every_seconds: float = Field(default=300.0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(
                f"must be 1-63 of a-z 0-9 _ . - starting with a letter or digit (got {value!r})"
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split into arguments: {exc}") from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in value if not _ENV_RE.match(k))
        if bad:
            raise ValueError(f"not valid variable names: {', '.join(map(repr, bad))}")
        return value


def _workers_problems(w: WorkersSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if w.max is not None and w.min > w.max:
        problems.append(("workers.min", f"must be ≤ workers.max (got {w.min} > {w.max})"))
    if w.initial is not None:
        if w.initial < w.min:
            problems.append(
                ("workers.initial", f"must be ≥ workers.min (got {w.initial} < {w.min})")
            )
        if w.initial > w.max_workers:
            problems.append(
                ("workers.initial", f"must be ≤ workers.max (got {w.initial} > {w.max_workers})")
            )
    return problems


#: Checks that span fields of one section, run whenever that section itself parsed, so a
#: type error elsewhere in the spec does not hide them.
_SECTION_CHECKS: dict[str, tuple[type[BaseModel], Callable[[Any], list[tuple[str, str]]]]] = {
    "workers": (WorkersSpec, _workers_problems),
}


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    msg = str(error.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    return [(_path(err["loc"]), _message(err)) for err in exc.errors()]


def _partial_check(
    key: str,
    model: type[BaseModel],
    check: Callable[[Any], list[tuple[str, str]]],
    raw: Any,
    known: list[tuple[str, str]],
) -> list[tuple[str, str]]:
    # The section as a whole failed; still check the fields of it that were fine, so the
    # user sees `min > max` together with the typo next to it.
    if not isinstance(raw, Mapping):
        try:
            raw = model.model_validate(raw).model_dump(exclude_unset=True)
        except ValidationError:
            return []
    bad = {p for p, _ in known}
    good = {
        k: v
        for k, v in raw.items()
        if k in model.model_fields and f"{key}.{k}" not in bad and key not in bad
    }
    try:
        return check(model.model_validate(good))
    except ValidationError:
        return []


def parse_spec(data: Any, source: str | None = None) -> JobSpec:
    """Validate plain data (e.g. parsed JSON) into a spec, or raise :class:`SpecError`.

    ``source`` (a file name) prefixes the error summary.
    """
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a job spec must be a mapping (got {type(data).__name__})")], source)
    problems: list[tuple[str, str]] = []
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems(exc))
    for key, (model, check) in _SECTION_CHECKS.items():
        if spec is not None:
            problems.extend(check(getattr(spec, key)))
        elif key in data:
            problems.extend(_partial_check(key, model, check, data[key], problems))
    if problems or spec is None:
        raise SpecError(problems, source)
    return spec


def parse_spec_yaml(text: str, source: str | None = None) -> JobSpec:
    """Parse and validate a spec written in YAML (JSON is YAML too)."""
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1} column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([("", f"invalid YAML{where}: {problem}")], source) from None
    return parse_spec(data, source)


def load_spec_file(path: str | Path) -> JobSpec:
    """Read and validate a YAML spec file; a missing or unreadable file is a :class:`SpecError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("", f"cannot read: {exc}")], str(p)) from None
    return parse_spec_yaml(text, source=str(p))


def _field_lines(text: str) -> dict[str, int]:
    """1-based line of every field path written in a YAML document (its key's line)."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                child = f"{path}.{key.value}" if path else str(key.value)
                lines.setdefault(child, key.start_mark.line + 1)
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                child = f"{path}[{i}]"
                lines.setdefault(child, item.start_mark.line + 1)
                walk(item, child)

    root = yaml.compose(text, Loader=_SpecLoader)  # a SafeLoader subclass
    if root is not None:
        walk(root, "")
    return lines


def locate_problems(text: str, problems: Sequence[tuple[str, str]]) -> list[int | None]:
    """For each ``(path, message)`` of a YAML spec, the 1-based line it names, if any.

    A path not written in the text (a required field left out, ``workers.min`` of
    ``workers: 3:1``) falls back to its nearest written parent; a YAML syntax error to the
    line where parsing stopped.
    """
    try:
        lines = _field_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = mark.line + 1 if mark is not None else None
        return [where if not path else None for path, _ in problems]
    found: list[int | None] = []
    for path, _ in problems:
        probe = path
        while probe and probe not in lines:
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        found.append(lines.get(probe) if probe else None)
    return found
