"""A refused spec's problems as its user reads them: each error pydantic found, as
``(field path, message)``, telling what was given where pydantic's message leaves it out,
and for an unknown field the field most likely meant. :mod:`tidal.spec` collects them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from tidal.spec_fields import shown

__all__ = ["field_path", "unknown_field", "validation_problems"]


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error's location as the spec's dotted path (``roles[1].replicas.min``)."""
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


def _field_names(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    """Every field name of ``model`` and of the models its fields hold, at any depth."""
    names: set[str] = set()
    if model in seen:
        return names
    seen.add(model)
    for name, info in model.model_fields.items():
        names.add(name)
        stack: list[Any] = [info.annotation]
        while stack:
            kind = stack.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                names |= _field_names(kind, seen)
            stack.extend(getattr(kind, "__args__", ()))
    return names


def unknown_field(key: object, model: type[BaseModel]) -> str:
    """``unknown field``, with the field of ``model`` (at any depth) most likely meant as
    a hint (``workrs`` → ``unknown field (did you mean `workers`?)``)."""
    close = difflib.get_close_matches(str(key), sorted(_field_names(model, set())), n=1)
    return f"unknown field (did you mean `{close[0]}`?)" if close else "unknown field"


def _message(error: Mapping[str, Any], model: type[BaseModel]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        loc = error.get("loc") or ("",)
        return unknown_field(loc[-1], model)
    if kind in _TYPE_ERRORS:
        return f"{_TYPE_ERRORS[kind]} (got {shown(error.get('input'))})"
    if kind == "finite_number":
        return "must be a finite number"
    msg = str(error.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")


def validation_problems(exc: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """Each error of validating ``model`` as a ``(field path, message)`` problem."""
    return [(field_path(err["loc"]), _message(err, model)) for err in exc.errors()]
