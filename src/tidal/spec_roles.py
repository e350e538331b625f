"""The sections of a job spec that describe its processes: ``workers``, ``resources`` and
``roles``.

A spec with ``roles:`` lists each role with its own command, env, working dir, resources,
replica count (fixed ``N`` or elastic ``MIN:MAX``; at most one role is elastic), restart
policy (Kubeflow's ``Never``, ``OnFailure``, ``Always``, ``ExitCode``), launcher, and
whether its success ends the job (Kubeflow's successPolicy). A spec without ``roles:`` has
one implicit ``worker`` role, written with the top-level ``command``, ``workers`` and
``resources`` as before.

The checks that span roles (distinct names, one elastic role, ``roles:`` beside
``command:``) are :func:`roles_problems`, run by :func:`tidal.spec.parse_spec`. What a
server can *run* is a separate question, answered by :mod:`tidal.controller.support`.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    field_validator,
    model_serializer,
    model_validator,
)

from tidal.spec_fields import (
    ENV_RE,
    MAX_ARGS,
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
    PathText,
    parse_memory,
    parse_workers_range,
    shown,
    text_problem,
)

__all__ = [
    "LAUNCHERS",
    "MAX_GPUS_PER_REPLICA",
    "MAX_ROLES",
    "RESTART_POLICIES",
    "Env",
    "LauncherName",
    "Name",
    "ResourcesSpec",
    "RestartPolicyName",
    "RoleRestartSpec",
    "RoleSpec",
    "SpecSection",
    "WorkersSpec",
    "env_key_problem",
    "roles_problems",
    "split_command",
    "workers_problems",
]

#: The launchers a role may name (what a server can start is another matter).
LAUNCHERS = ("tidal", "torchrun", "tf", "mpi", "ps")
LauncherName = Literal["tidal", "torchrun", "tf", "mpi", "ps"]
#: Kubeflow's restart policies, spelled as Kubeflow spells them.
RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")
RestartPolicyName = Literal["Never", "OnFailure", "Always", "ExitCode"]
#: More roles than any real job has (TFJob has five kinds of replica).
MAX_ROLES = 16
#: GPUs one replica of a role may ask for (a whole 8- or 16-GPU host is the common most).
MAX_GPUS_PER_REPLICA = 64


def split_command(value: Any) -> Any:
    """A command string split like a shell would (no expansion); a list as it is, unless
    it is one element with blanks in it (``["python train.py --epochs 60"]``, Arena's
    quoted command), which is that string split. One rule for a spec's ``command`` in
    YAML, JSON and ``tidal submit``'s arguments: a program whose own path has a blank is
    written quoted (``"'/opt/my tools/train'"``) or with its arguments as a list.

    Raises ``ValueError`` for text too long, unsafe or unsplittable.
    """
    if (
        isinstance(value, list)
        and len(value) == 1
        and isinstance(value[0], str)
        and any(c.isspace() for c in value[0])
    ):
        value = value[0]
    if not isinstance(value, str):
        return value
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


def env_key_problem(env: dict[str, str]) -> str | None:
    """Why some keys of ``env`` are not variable names, or ``None`` when all are."""
    bad = sorted(shown(k) for k in env if len(k) > MAX_ENV_KEY or not ENV_RE.fullmatch(k))
    if not bad:
        return None
    return (
        "not valid variable names (A-Z a-z 0-9 _, not starting with a digit, "
        f"at most {MAX_ENV_KEY} characters): {', '.join(bad)}"
    )


def _check_name(value: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            f"must be 1-63 of a-z 0-9 _ . - starting with a letter or digit (got {shown(value)})"
        )
    return value


def _check_env(value: dict[str, str]) -> dict[str, str]:
    problem = env_key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A job's or a role's name: it becomes part of ids, folder and log names.
Name = Annotated[str, Strict(), AfterValidator(_check_name)]
#: Variables added to a process's environment.
Env = Annotated[dict[str, EnvValue], Field(max_length=MAX_ENV), AfterValidator(_check_env)]


class SpecSection(BaseModel):
    """A part of a spec: frozen, and unknown keys refused. Written out (stored, sent,
    shown), a field left unset is left out rather than written null: a spec is read
    back as it was written, and new input refuses nulls (:func:`tidal.spec.parse_spec`)."""

    # Unknown keys are typos far more often than intent: refuse them.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class WorkersSpec(SpecSection):
    """How many workers (one slot each) the job may run: ``min ≤ initial ≤ max``."""

    min: Count = Field(default=1, ge=1, le=MAX_WORKERS)
    #: Defaults to ``min`` (a fixed-size job).
    max: Count | None = Field(default=None, ge=1, le=MAX_WORKERS)
    #: The size the job is held at (its target, Arena's ``--workers``) when below ``max``;
    #: ``tidal scale`` sets another. Defaults to ``max``: no target, the job grows into
    #: idle slots.
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

    @property
    def elastic(self) -> bool:
        """Whether the size may change while the job runs."""
        return self.max_workers != self.min


def workers_problems(w: WorkersSpec, path: str = "workers") -> list[tuple[str, str]]:
    """What is wrong across the fields of a workers (or replicas) section at ``path``."""
    problems: list[tuple[str, str]] = []
    if w.max is not None and w.min > w.max:
        problems.append((f"{path}.min", f"must be ≤ {path}.max (got {w.min} > {w.max})"))
    if w.initial is not None:
        if w.initial < w.min:
            problems.append(
                (f"{path}.initial", f"must be ≥ {path}.min (got {w.initial} < {w.min})")
            )
        if w.initial > w.max_workers:
            problems.append(
                (
                    f"{path}.initial",
                    f"must be ≤ {path}.max (got {w.initial} > {w.max_workers})",
                )
            )
    return problems


class ResourcesSpec(SpecSection):
    """What one worker (one replica of a role) needs. It holds one slot per GPU, all on
    one host, or one CPU slot when it asks for none."""

    gpus: Count = Field(default=1, ge=0, le=MAX_GPUS_PER_REPLICA)
    #: CPUs per worker; unset: none reserved and the worker not confined to any (a GPU
    #: worker's loader processes use what the host has).
    cpus: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, le=MAX_CPUS, allow_inf_nan=False
    )
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


class RoleRestartSpec(SpecSection):
    """When a role's failed replicas are restarted, and how many failures the job survives."""

    policy: RestartPolicyName = "OnFailure"
    #: Defaults to the job's ``restart.max_restarts``.
    max_restarts: Count | None = Field(default=None, ge=0, le=MAX_RESTARTS)

    @classmethod
    def _from_text(cls, value: Any) -> Any:
        return {"policy": value} if isinstance(value, str) else value


class RoleSpec(SpecSection):
    """One role of a job: what its replicas run and how many of them run."""

    name: Name
    command: list[Arg] = Field(min_length=1, max_length=MAX_ARGS)
    env: Env = Field(default_factory=dict)
    #: Defaults to the job's ``working_dir``.
    working_dir: PathText | None = None
    #: Per replica.
    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec())
    #: ``N`` (fixed), ``MIN:MAX`` (elastic) or ``{min, max, initial}``.
    replicas: WorkersSpec = Field(default_factory=lambda: WorkersSpec())
    restart: RoleRestartSpec = Field(default_factory=RoleRestartSpec)
    launcher: LauncherName = "tidal"
    #: Whether the job succeeds once every replica of this role exited 0. When no role
    #: says, Kubeflow's default: the ``chief`` (or ``master``) role, else the ``worker``
    #: role, else every role.
    ends_job: Annotated[bool, Strict()] | None = None

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        return split_command(value)

    @field_validator("restart", mode="before")
    @classmethod
    def _restart(cls, value: Any) -> Any:
        # `restart: OnFailure` reads better than a mapping with only the policy.
        return RoleRestartSpec._from_text(value)


def roles_problems(roles: Sequence[RoleSpec]) -> list[tuple[str, str]]:
    """What is wrong across ``roles``: each role's replica range, names given twice, more
    than one elastic role (the policy grows and shrinks one group per job; the others are
    placed whole)."""
    problems: list[tuple[str, str]] = []
    for i, role in enumerate(roles):
        problems.extend(workers_problems(role.replicas, f"roles[{i}].replicas"))
    seen: dict[str, int] = {}
    for i, role in enumerate(roles):
        if role.name in seen:
            problems.append(
                (f"roles[{i}].name", f"{shown(role.name)} is already roles[{seen[role.name]}]")
            )
        seen.setdefault(role.name, i)
    if roles and all(role.ends_job is False for role in roles):
        problems.append(("roles", "no role ends the job: give one role ends_job: true"))
    problems.extend(_ps_chief_problems(roles))
    stretchy = [i for i, role in enumerate(roles) if role.replicas.elastic]
    for i in stretchy[1:]:
        problems.append(
            (
                f"roles[{i}].replicas",
                f"only one role may be elastic (MIN:MAX); roles[{stretchy[0]}] "
                f"{shown(roles[stretchy[0]].name)} already is: give this one a fixed count",
            )
        )
    return problems


def _ps_chief_problems(roles: Sequence[RoleSpec]) -> list[tuple[str, str]]:
    """A parameter-server job's ``chief`` (``launcher: ps``) is one observer of the job's
    servers: exactly one replica, and a ``ps`` role to observe."""
    problems: list[tuple[str, str]] = []
    for i, role in enumerate(roles):
        if role.name != "chief" or role.launcher != "ps":
            continue
        r = role.replicas
        if r.min != 1 or r.max_workers != 1:
            shown_count = str(r.min) if not r.elastic else f"{r.min}:{r.max_workers}"
            problems.append(
                (
                    f"roles[{i}].replicas",
                    f"a parameter-server job has exactly 1 chief (got {shown_count})",
                )
            )
        if not any(other.name == "ps" for other in roles):
            problems.append(
                (
                    f"roles[{i}].launcher",
                    "a chief with launcher 'ps' observes the job's parameter servers: "
                    "the job needs a 'ps' role",
                )
            )
    return problems
