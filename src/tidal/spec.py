"""The job spec: what a user submits, as a pydantic model with a YAML form.

A spec is accepted whole or refused whole. A refused spec raises :class:`SpecError`, which
lists every problem found, each with the dotted path of the field at fault
(``workers.min: must be ≤ workers.max (got 4 > 2)``), so one round trip fixes them all.

Specs come from untrusted users: the fields' types (:mod:`tidal.spec_fields`) are strict
and bounded, and documents are loaded by :mod:`tidal.documents`, which bounds their size,
depth and alias expansion.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationError,
    field_validator,
    model_serializer,
)

from tidal.documents import load_yaml
from tidal.documents_bounds import SPEC_LIMITS, DocumentError
from tidal.documents_json import load_json
from tidal.spec_fields import (
    MAX_ARGS,
    MAX_CHECKPOINT_SECONDS,
    MAX_CHECKPOINT_STEPS,
    MAX_RESTARTS,
    Arg,
    Count,
    GroupText,
    Labels,
    PathText,
    parse_memory,
    parse_workers_range,
    shown,
    text_problem,
)
from tidal.spec_lines import locate_problems
from tidal.spec_problems import unknown_field, validation_problems
from tidal.spec_roles import (
    MAX_ROLES,
    Env,
    Name,
    ResourcesSpec,
    RoleSpec,
    SpecSection,
    WorkersSpec,
    roles_problems,
    split_command,
    workers_problems,
)

__all__ = [
    "JobSpec",
    "ResourcesSpec",
    "RestartSpec",
    "RoleSpec",
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


class TargetSpec(SpecSection):
    """Where the job may run: a resource group and node labels every host must carry."""

    group: GroupText | None = None
    labels: Labels = Field(default_factory=dict)


class RestartSpec(SpecSection):
    """How many worker failures the job survives before it is marked failed."""

    max_restarts: Count = Field(default=3, ge=0, le=MAX_RESTARTS)


class JobSpec(SpecSection):
    """A training job as submitted: the command and how elastic it may be."""

    name: Name
    #: The program each worker runs; a string is split like a shell would (no expansion).
    #: Required unless the spec lists ``roles``.
    command: list[Arg] | None = Field(default=None, min_length=1, max_length=MAX_ARGS)
    working_dir: PathText | None = None
    env: Env = Field(default_factory=dict)
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
    #: The team whose queue the job waits in (``tidal server --teams``); ``None``: the
    #: default team.
    team: Name | None = None
    #: Several kinds of process (see :mod:`tidal.spec_roles`); ``None``: one ``worker``
    #: role made of ``command``, ``workers`` and ``resources``. ``env`` and
    #: ``working_dir`` above are every role's defaults.
    roles: list[RoleSpec] | None = Field(default=None, min_length=1, max_length=MAX_ROLES)
    #: What starts the workers: ``tidal`` (in-place resize) or ``torchrun`` (torchrun's
    #: environment for an unmodified script; every resize restarts all workers).
    launcher: Literal["tidal", "torchrun"] = "tidal"

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        return split_command(value)

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A one-role spec is stored exactly as before roles existed (older releases read
        # it back); a spec with roles has none of the one-role fields.
        data: dict[str, Any] = handler(self)
        if data.get("launcher") == "tidal":
            data.pop("launcher")  # the default, stored as before launchers existed
        if data.get("roles") is None:
            data.pop("roles", None)
        else:
            # The one-role fields are not used with roles (and refused if given).
            for key in ("command", "workers", "resources", "launcher"):
                data.pop(key, None)
        return data

    @property
    def has_roles(self) -> bool:
        """Whether the spec lists its roles (``roles:``) rather than one implicit worker."""
        return self.roles is not None


def _form_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """A spec is either one implicit role (``command``, ``workers``, ``resources``) or
    ``roles:``; never both, never neither."""
    if spec.roles is None:
        return [] if spec.command is not None else [("command", "required")]
    problems = [
        (key, f"not used with roles: give each role its own {what}")
        for key, what in (
            ("command", "command (roles[i].command)"),
            ("workers", "replica count (roles[i].replicas)"),
            ("resources", "resources (roles[i].resources)"),
            ("launcher", "launcher (roles[i].launcher)"),
        )
        if key in spec.model_fields_set
    ]
    return problems + roles_problems(spec.roles)


#: Checks that span fields of one section, run whenever that section itself parsed, so a
#: type error elsewhere in the spec does not hide them.
_SECTION_CHECKS: dict[str, tuple[type[BaseModel], Callable[[Any], list[tuple[str, str]]]]] = {
    "workers": (WorkersSpec, workers_problems),
}


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


def _given_values(data: Mapping[Any, Any], problems: list[tuple[str, str]]) -> None:
    """A size written says it: ``workers`` (a role's ``replicas``) is not an empty mapping
    (read as 1:1) and none of its fields null (``max: null`` read as ``min``); leaving
    the section or a field out is how to ask for the defaults. Each such problem, with its
    field, goes to ``problems``."""

    def check(section: Any, path: str) -> None:
        if not isinstance(section, Mapping):
            return
        if not section:
            problems.append((path, "empty: give min (and max), or leave it out for 1"))
        for key, value in section.items():
            if value is None and isinstance(key, str):
                problems.append(
                    (f"{path}.{key}", "null: give a count, or leave it out for the default")
                )

    if "workers" in data:
        check(data["workers"], "workers")
    roles = data.get("roles")
    if isinstance(roles, list):
        for i, role in enumerate(roles):
            if isinstance(role, Mapping) and "replicas" in role:
                check(role["replicas"], f"roles[{i}].replicas")


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
            problems.append((f"{path}.{text}" if path else text, unknown_field(text, JobSpec)))
    return kept


def _insert_in_field_order(problems: list[tuple[str, str]], problem: tuple[str, str]) -> None:
    """Insert ``problem`` before the first problem of a later field (or an unknown one), so
    the list reads in the order the spec's fields are declared, as pydantic lists them."""
    order = list(JobSpec.model_fields)
    rank = order.index(problem[0].split(".")[0])

    def field_rank(path: str) -> int:
        top = re.split(r"[.\[]", path, maxsplit=1)[0]
        return order.index(top) if top in order else len(order)

    at = next((i for i, (p, _) in enumerate(problems) if p and field_rank(p) > rank), None)
    problems.insert(len(problems) if at is None else at, problem)


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
    _given_values(data, problems)
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, JobSpec))
        if "command" not in data and "roles" not in data:
            _insert_in_field_order(problems, ("command", "required"))
    if spec is not None:
        problems.extend(_form_problems(spec))
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
