"""A job's parameters as its script reads them: ``tidal.params()``.

A job started from a registered model carries the parameters typed into ``tidal train
--set`` (or the dashboard's form) as JSON in ``TIDAL_PARAMS`` (a flat object, name →
value) and the location of the dataset it trains on in ``TIDAL_DATASET`` (a path or a
URL). The script names its own defaults, which hold where the job says nothing, so the
same script runs by hand unchanged::

    p = tidal.params(epochs=10, lr=0.1, dataset="data/digits")
    for epoch in state.epochs(p.epochs): ...

A value the job gives for a parameter the script has a default for is converted to the
default's type (an ``int`` default takes ``3`` or ``"3"``, a ``float`` default takes ``1``);
one that does not convert is a :class:`ParamsError` naming the parameter. Parameters
without a default come as the JSON has them. No torch here: the module loads with
``import tidal``'s light names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tidal.runtime.env import ENV_DATASET, ENV_PARAMS, ConfigError

#: The keyword naming the dataset location's default (not a parameter).
DATASET = "dataset"

__all__ = ["DATASET", "ENV_DATASET", "ENV_PARAMS", "Params", "ParamsError", "params"]


class ParamsError(ConfigError):
    """A job's parameter is malformed or of a type the script cannot take; the message
    names the variable and the parameter."""


class Params(Mapping[str, Any]):
    """The job's parameters: a read-only mapping, each also an attribute (``p.lr``), and
    :attr:`dataset`, the dataset's location (``None`` when neither the job nor the script
    names one)."""

    def __init__(self, values: Mapping[str, Any], dataset: str | None) -> None:
        self._values = dict(values)
        self.dataset = dataset

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not attributes of the object itself.
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        known = ", ".join(sorted(values)) or "none"
        raise AttributeError(f"no parameter {name!r} (the job's parameters: {known})")

    def __repr__(self) -> str:
        return f"Params({self._values!r}, dataset={self.dataset!r})"


def _typed(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default``; raises :class:`ParamsError` naming ``name``."""
    if default is None or value is None:
        return value
    wanted = type(default)
    problem = f"{ENV_PARAMS}: {name}: expected {_kind(default)} like the script's default"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ParamsError(f"{problem} {default!r}, got {value!r}")
    if isinstance(default, int | float) and not isinstance(value, bool):
        try:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, int | float):
                if wanted is int and float(number).is_integer():
                    return int(number)
                if wanted is float:
                    return float(number)
        except ValueError:
            pass
        raise ParamsError(f"{problem} {default!r}, got {value!r}")
    if isinstance(value, wanted):
        return value
    raise ParamsError(f"{problem} {default!r}, got {value!r}")


def _kind(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, str):
        return "a string"
    return f"a {type(default).__name__}"


def _from_env() -> dict[str, Any]:
    raw = os.environ.get(ENV_PARAMS)
    if raw is None or not raw.strip():
        return {}
    try:
        given = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ParamsError(f"{ENV_PARAMS}: expected a JSON object, got {raw!r} ({exc})") from None
    if not isinstance(given, dict):
        raise ParamsError(
            f"{ENV_PARAMS}: expected a JSON object (name → value), got {type(given).__name__}"
        )
    if DATASET in given:
        raise ParamsError(
            f"{ENV_PARAMS}: {DATASET}: the dataset's location comes in {ENV_DATASET}, "
            "not as a parameter"
        )
    return given


def params(dataset: str | None = None, **defaults: Any) -> Params:
    """The job's parameters, typed by the script's ``defaults`` (used where the job gives
    none), and the dataset's location: ``TIDAL_DATASET``, else ``dataset``.

    Raises :class:`ParamsError` naming the parameter whose value does not convert.
    """
    given = _from_env()
    values = dict(defaults)
    for name, value in given.items():
        values[name] = _typed(name, value, defaults.get(name))
    location = os.environ.get(ENV_DATASET) or dataset
    return Params(values, location)
