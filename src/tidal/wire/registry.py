"""The registry's bodies (datasets, models, their versions, a training request) and the
check of a model's parameters, shared by the server, the SDK and the CLI.

A model declares typed parameters (:class:`ParamSpec`: ``int``, ``float``, ``str`` or
``bool``, a default, a range or a set of choices); a training request's values are
checked against them by :func:`check_params`, which is pure. The checked values reach
the job's workers as JSON in :data:`ENV_PARAMS`, and the dataset version's location in
:data:`ENV_DATASET`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from tidal.wire.schema import RequestBody

__all__ = [
    "ENV_DATASET",
    "ENV_PARAMS",
    "MODEL_LABEL",
    "DatasetIn",
    "DatasetVersionView",
    "DatasetView",
    "ModelAlias",
    "ModelIn",
    "ModelVersionView",
    "ModelView",
    "ParamError",
    "ParamSpec",
    "ParamType",
    "ParamValue",
    "RegistryName",
    "TrainRequest",
    "check_params",
    "coerce_param",
    "is_url",
    "parse_dataset_ref",
    "parse_param_flag",
]

#: The job's parameters, a flat JSON object name → value, checked against the model's.
ENV_PARAMS = "TIDAL_PARAMS"
#: Where the job's dataset version is: a path on the workers' hosts, or a URL.
ENV_DATASET = "TIDAL_DATASET"
#: The label a job started from a model carries: the model's name.
MODEL_LABEL = "tidal.model"

#: A dataset's or model's name: as a job's (a model's training job is named after it).
RegistryName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]
ParamType = Literal["int", "float", "str", "bool"]
ParamValue = int | float | str | bool
#: Parameters a model may declare, and the longest text of a parameter's value.
MAX_PARAMS = 64
MAX_TEXT = 1024

_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class ParamSpec(RequestBody):
    """One parameter a model's script reads: its type, default, and allowed values."""

    name: Annotated[str, Field(pattern=_PARAM_NAME.pattern)]
    type: ParamType
    default: ParamValue
    #: The range of an ``int`` or ``float`` (inclusive); ``None``: unbounded.
    min: float | None = None
    max: float | None = None
    #: The values a ``str`` may take; ``None``: any.
    choices: list[str] | None = Field(default=None, min_length=1, max_length=MAX_PARAMS)
    help: str = Field(default="", max_length=MAX_TEXT)

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        numeric = self.type in ("int", "float")
        if not numeric and (self.min is not None or self.max is not None):
            raise ValueError(f"{self.name}: min and max apply to int and float parameters only")
        if self.choices is not None and self.type != "str":
            raise ValueError(f"{self.name}: choices apply to str parameters only")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{self.name}: min {self.min} is above max {self.max}")
        try:
            self.default = coerce_param(self, self.default)
        except ValueError as exc:
            raise ValueError(f"{self.name}: default {self.default!r}: {exc}") from None
        return self


class ParamError(ValueError):
    """Parameters refused; ``problems`` lists ``(field, message)``, the field as
    ``params.NAME``."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


def _number(value: Any, kind: ParamType) -> int | float:
    if isinstance(value, bool):
        raise ValueError(f"expected {kind_name(kind)}, got a boolean")
    if kind == "int":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    else:
        raise ValueError(f"expected a number, got {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def kind_name(kind: ParamType) -> str:
    """The type as messages say it."""
    return {"int": "an integer", "float": "a number", "str": "text", "bool": "true or false"}[kind]


def coerce_param(spec: ParamSpec, value: Any) -> ParamValue:
    """``value`` as ``spec``'s type (text as typed on a command line or in a form is
    read), within its range or choices; :class:`ValueError` saying what was expected."""
    if spec.type in ("int", "float"):
        number = _number(value, spec.type)
        if spec.min is not None and number < spec.min:
            raise ValueError(f"must be ≥ {_plain(spec.min)}, got {_plain(number)}")
        if spec.max is not None and number > spec.max:
            raise ValueError(f"must be ≤ {_plain(spec.max)}, got {_plain(number)}")
        return number
    if spec.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError(f"expected true or false, got {value!r}")
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {value!r}")
    if len(value) > MAX_TEXT:
        raise ValueError(f"at most {MAX_TEXT} characters, got {len(value)}")
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(f"expected one of {', '.join(spec.choices)}, got {value!r}")
    return value


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def check_params(specs: Sequence[ParamSpec], given: Mapping[str, Any]) -> dict[str, ParamValue]:
    """Every declared parameter's value: ``given``'s, checked and typed, else its
    default. :class:`ParamError` naming each unknown, mistyped or out-of-range one."""
    declared = {p.name: p for p in specs}
    problems = [
        (f"params.{name}", f"unknown parameter (the model declares {_names(declared)})")
        for name in given
        if name not in declared
    ]
    values: dict[str, ParamValue] = {}
    for name, spec in declared.items():
        if name not in given:
            values[name] = spec.default
            continue
        try:
            values[name] = coerce_param(spec, given[name])
        except ValueError as exc:
            problems.append((f"params.{name}", str(exc)))
    if problems:
        raise ParamError(problems)
    return values


def _names(declared: Mapping[str, ParamSpec]) -> str:
    return ", ".join(declared) if declared else "none"


#: ``NAME:TYPE=DEFAULT`` then ``[MIN,MAX]`` (either side may be empty) or ``{A,B,...}``.
_FLAG = re.compile(
    r"^(?P<name>[^:=]+):(?P<type>[a-z]+)=(?P<default>[^\[{]*)"
    r"(?:\[(?P<min>[^,\]]*),(?P<max>[^\]]*)\]|\{(?P<choices>[^}]*)\})?$"
)


def parse_param_flag(text: str) -> ParamSpec:
    """A parameter as written on the command line: ``epochs:int=10[1,100]``,
    ``lr:float=0.1[0.0001,1]``, ``optimizer:str=sgd{sgd,adam}``, ``shuffle:bool=true``.
    :class:`ValueError` saying what was expected."""
    match = _FLAG.match(text.strip())
    if match is None:
        raise ValueError(
            f"expected NAME:TYPE=DEFAULT, then [MIN,MAX] or {{A,B}} (got {text!r}), "
            "e.g. epochs:int=10[1,100]"
        )
    kind = match["type"]
    if kind not in ("int", "float", "str", "bool"):
        raise ValueError(f"{match['name']}: type must be int, float, str or bool (got {kind!r})")
    fields: dict[str, Any] = {"name": match["name"], "type": kind, "default": match["default"]}
    for bound in ("min", "max"):
        if match[bound]:
            try:
                fields[bound] = float(match[bound])
            except ValueError:
                raise ValueError(f"{match['name']}: {bound} must be a number") from None
    if match["choices"] is not None:
        fields["choices"] = [c.strip() for c in match["choices"].split(",") if c.strip()]
    return ParamSpec.model_validate(fields)


#: ``scheme://...``: a location the workers read from a store, not the host's files.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location: str) -> bool:
    """Whether a dataset's ``location`` is a URL rather than a path."""
    return bool(_URL.match(location))


def parse_dataset_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME:VERSION``; :class:`ValueError` if the version is not a number."""
    name, sep, version = ref.partition(":")
    if not sep:
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise ValueError(f"expected NAME or NAME:VERSION with VERSION ≥ 1 (got {ref!r})")
    return name, int(version)


# -- datasets -------------------------------------------------------------------------------


class DatasetIn(RequestBody):
    """A dataset version to register: a new dataset, or the next version of one."""

    name: RegistryName
    #: A local path on the server's (and workers') hosts, or a URL the workers can read.
    location: str = Field(min_length=1, max_length=4096)
    format: str = Field(default="", max_length=63)
    description: str = Field(default="", max_length=MAX_TEXT)


class DatasetVersionView(BaseModel):
    """One version of a dataset, and the model versions trained on it."""

    dataset: str
    version: int
    location: str
    format: str
    #: Bytes and SHA-256 of a local path's files, computed at registration (a URL: none).
    size: int | None
    checksum: str | None
    description: str
    created_at: float
    #: ``MODEL:VERSION`` of each model version trained on this dataset version.
    used_by: list[str] = Field(default_factory=list)


class DatasetView(BaseModel):
    """A dataset and its versions, oldest first."""

    name: str
    owner: str
    description: str
    created_at: float
    versions: list[DatasetVersionView]


# -- models ---------------------------------------------------------------------------------


class ModelIn(RequestBody):
    """A model to register: where its code is, how to run it, what it reads."""

    name: RegistryName
    framework: str = Field(default="pytorch", max_length=63)
    #: The folder of the model's code, on the server's (and workers') hosts.
    code: str = Field(min_length=1, max_length=4096)
    #: The script the job runs, relative to ``code`` (``python ENTRY``).
    entry_point: str = Field(min_length=1, max_length=4096)
    params: list[ParamSpec] = Field(default_factory=list, max_length=MAX_PARAMS)
    #: The dataset it trains on unless a training request names another.
    dataset: RegistryName | None = None
    description: str = Field(default="", max_length=MAX_TEXT)
    tags: dict[str, str] = Field(default_factory=dict, max_length=64)

    @model_validator(mode="after")
    def _unique_params(self) -> ModelIn:
        seen: set[str] = set()
        for p in self.params:
            if p.name in seen:
                raise ValueError(f"parameter {p.name} is declared twice")
            seen.add(p.name)
        return self


class ModelVersionView(BaseModel):
    """A model version: a finished training job's output and where it came from."""

    model: str
    version: int
    job_id: str | None
    checkpoint: str | None
    metrics: dict[str, float]
    params: dict[str, ParamValue]
    #: ``DATASET:VERSION`` it was trained on, if any.
    dataset: str | None
    aliases: list[str]
    created_at: float


class ModelView(BaseModel):
    """A registered model."""

    name: str
    framework: str
    code: str
    entry_point: str
    params: list[ParamSpec]
    dataset: str | None
    description: str
    owner: str
    tags: dict[str, str]
    created_at: float
    #: Alias → version.
    aliases: dict[str, int]
    latest_version: int | None


class ModelAlias(RequestBody):
    """Point an alias (``champion``) at one of the model's versions."""

    version: int = Field(ge=1)


class TrainRequest(RequestBody):
    """Train a model: a job running its entry point with these parameters."""

    #: ``NAME`` or ``NAME:VERSION``; the model's own dataset (latest version) if omitted.
    dataset: str | None = Field(default=None, max_length=80)
    params: dict[str, Any] = Field(default_factory=dict, max_length=MAX_PARAMS)
    #: ``N`` or ``MIN:MAX``, as ``tidal submit --workers``.
    workers: str | int = 1
    priority: int | None = Field(default=None, ge=1)
