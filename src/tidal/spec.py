"""The job spec: what a user submits, as a pydantic model with a YAML form.

A spec is accepted whole or refused whole. A refused spec raises :class:`SpecError`, which
lists every problem found, each with the dotted path of the field at fault
(``workers.min: must be ≤ workers.max (got 4 > 2)``), so one round trip fixes them all.

Specs come from untrusted users: the fields' types (:mod:`tidal.spec_fields`) are strict
and bounded, and documents are loaded by :mod:`tidal.documents`, which bounds their size,
depth and alias expansion.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from tidal.documents import SPEC_LIMITS, DocumentError, compose_yaml, load_json, load_yaml
from tidal.spec_fields import (
    ENV_RE,
    MAX_ARGS,
    MAX_CHECKPOINT_SECONDS,
    MAX_CHECKPOINT_STEPS,
    MAX_COMMAND_TEXT,
    MAX_CPUS,
    MAX_ENV,
    MAX_ENV_KEY,
    MAX_MEMORY,
    MAX_RESTARTS,
    MAX_WORKERS,
    NAME_RE,
    Arg,
    Count,
    EnvValue,
    GroupText,
    Labels,
    PathText,
    parse_memory,
    parse_workers_range,
    shown,
    text_problem,
)

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
    "parse_spec_json",
    "parse_spec_yaml",
    "parse_workers_range",
    "text_problem",
]

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


class _Section(BaseModel):
    # Unknown keys are typos far more often than intent: refuse them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkersSpec(_Section):
    """How many workers (one slot each) the job may run: ``min ≤ initial ≤ max``."""

    min: Count = Field(default=1, ge=1, le=MAX_WORKERS)
    #: Defaults to ``min`` (a fixed-size job).
    max: Count | None = Field(default=None, ge=1, le=MAX_WORKERS)
    #: Size to start at when slots allow; defaults to ``max``.
    initial: Count | None = Field(default=None, ge=1, le=MAX_WORKERS)

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

    gpus: Count = Field(default=1, ge=0, le=1)
    cpus: Annotated[float, Strict()] = Field(default=1.0, gt=0, le=MAX_CPUS, allow_inf_nan=False)
    #: Bytes, written as ``4Gi``, ``512M`` or a plain number.
    memory: Count | None = Field(default=None, ge=0, le=MAX_MEMORY)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None:
            return value
        # A JSON number may arrive as a float (4e9): fine when it is a whole number.
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        return parse_memory(value)


class TargetSpec(_Section):
    """Where the job may run: a resource group and node labels every host must carry."""

    group: GroupText | None = None
    labels: Labels = Field(default_factory=dict)


class RestartSpec(_Section):
    """How many worker failures the job survives before it is marked failed."""

    max_restarts: Count = Field(default=3, ge=0, le=MAX_RESTARTS)


class JobSpec(_Section):
    """A training job as submitted: the command and how elastic it may be."""

    name: Annotated[str, Strict()]
    #: The program each worker runs; a string is split like a shell would (no expansion).
    command: list[Arg] = Field(min_length=1, max_length=MAX_ARGS)
    working_dir: PathText | None = None
    env: dict[str, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    #: Higher is more important.
    priority: Count = Field(default=DEFAULT_PRIORITY, ge=1, le=MAX_PRIORITY)
    target: TargetSpec = Field(default_factory=TargetSpec)
    restart: RestartSpec = Field(default_factory=RestartSpec)
    checkpoint_dir: PathText | None = None
    #: Durable checkpoints every N steps (0: off) and every S seconds (0: off); a job whose
    #: workers all die resumes from the latest one.
    checkpoint_every_steps: Count = Field(default=0, ge=0, le=MAX_CHECKPOINT_STEPS)
    checkpoint_every_seconds: Annotated[float, Strict()] = Field(
        default=300.0, ge=0, le=MAX_CHECKPOINT_SECONDS, allow_inf_nan=False
    )
    labels: Labels = Field(default_factory=dict)
    #: What starts the workers: ``tidal`` (in-place resize) or ``torchrun`` (torchrun's
    #: environment for an unmodified script; every resize restarts all workers).
    launcher: Literal["tidal", "torchrun"] = "tidal"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(
                "must be 1-63 of a-z 0-9 _ . - starting with a letter or digit "
                f"(got {shown(value)})"
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            # shlex takes ~15 µs a character: bound the text before splitting it.
            if len(value) > MAX_COMMAND_TEXT:
                raise ValueError(f"longer than {MAX_COMMAND_TEXT} characters (got {len(value)})")
            problem = text_problem(value)
            if problem is not None:
                raise ValueError(problem)
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split into arguments: {exc}") from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(shown(k) for k in value if len(k) > MAX_ENV_KEY or not ENV_RE.fullmatch(k))
        if bad:
            raise ValueError(
                "not valid variable names (A-Z a-z 0-9 _, not starting with a digit, "
                f"at most {MAX_ENV_KEY} characters): {', '.join(bad)}"
            )
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
        if isinstance(part, str) and not part.isprintable():
            part = shown(part)[1:-1]  # a key with a newline or a lone surrogate, escaped
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


#: Type errors, told with what was given (pydantic's own message leaves it out).
_TYPE_ERRORS = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
}


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in _TYPE_ERRORS:
        return f"{_TYPE_ERRORS[kind]} (got {shown(error.get('input'))})"
    if kind == "finite_number":
        return "must be a finite number"
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


_SECTIONS = ("workers", "resources", "target", "restart")


def _readable_keys(
    data: Mapping[Any, Any], path: str, problems: list[tuple[str, str]]
) -> dict[Any, Any]:
    """``data`` without the keys no field can have (not text, or not encodable), each of
    them a problem: pydantic cannot even report such a key as unknown."""
    kept: dict[Any, Any] = {}
    for key, value in data.items():
        if isinstance(key, str) and text_problem(key) is None:
            kept[key] = value
        else:
            text = shown(key).strip("'") if isinstance(key, str) else shown(key)
            problems.append((f"{path}.{text}" if path else text, "unknown field"))
    return kept


def parse_spec(data: Any, source: str | None = None) -> JobSpec:
    """Validate plain data (e.g. parsed JSON) into a spec, or raise :class:`SpecError`.

    ``source`` (a file name) prefixes the error summary.
    """
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a job spec must be a mapping (got {type(data).__name__})")], source)
    problems: list[tuple[str, str]] = []
    data = _readable_keys(data, "", problems)
    for section in _SECTIONS:
        if isinstance(data.get(section), Mapping):
            data[section] = _readable_keys(data[section], section, problems)
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
    """Parse and validate a spec written in YAML (JSON is YAML too), within the bounds of
    :data:`tidal.documents.SPEC_LIMITS`."""
    try:
        data = load_yaml(text, SPEC_LIMITS)
    except DocumentError as exc:
        raise SpecError(exc.problems, source) from None
    return parse_spec(data, source)


def parse_spec_json(text: str | bytes, source: str | None = None) -> JobSpec:
    """Parse and validate a spec written in JSON (a key given twice is refused), within the
    bounds of :data:`tidal.documents.SPEC_LIMITS`."""
    try:
        data = load_json(text, SPEC_LIMITS)
    except DocumentError as exc:
        raise SpecError(exc.problems, source) from None
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

    root = compose_yaml(text, SPEC_LIMITS)
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
    except DocumentError as exc:
        # The spec was refused for the same reason: each problem is on the line it names.
        where = _problem_line(exc)
        return [where for _ in problems]
    found: list[int | None] = []
    for path, _ in problems:
        probe = path
        while probe and probe not in lines:
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        found.append(lines.get(probe) if probe else None)
    return found


def _problem_line(exc: DocumentError) -> int | None:
    """The line a document's first problem names in its message, if any."""
    match = re.search(r"line ([0-9]+)", exc.problems[0][1]) if exc.problems else None
    return int(match.group(1)) if match else None
