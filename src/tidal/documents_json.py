"""Untrusted JSON documents, loaded within the bounds of :mod:`tidal.documents_bounds`.

Python's JSON parser keeps the last of duplicate keys and reads integers of any length;
:func:`load_json` reads objects as ordered pairs and long integers as placeholders, then
checks depth, size and duplicate keys while making plain data, naming each problem by its
path. :mod:`tidal.documents` re-exports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidal.documents_bounds import (
    MAX_DIGITS,
    SPEC_LIMITS,
    DocumentError,
    DocumentLimits,
    encoded,
    join_path,
    shortened_path,
)

__all__ = ["load_json"]


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members in order, before duplicate keys are checked."""


@dataclass(frozen=True)
class _LongNumber:
    """An integer written with too many digits, refused (with its path) once placed."""

    digits: int


def _parse_int(text: str) -> int | _LongNumber:
    return int(text) if len(text) <= MAX_DIGITS else _LongNumber(len(text))


def _to_plain(root: Any, limits: DocumentLimits) -> Any:
    """``root`` with objects made dicts, checking depth, size and duplicate keys.

    Iterative (an explicit stack), so no input can exhaust the interpreter's stack.
    """
    nodes = 0

    def shell(value: Any, path: str, depth: int) -> Any:
        # A container's copy with its members still to fill in, or a scalar as is.
        nonlocal nodes
        nodes += 1
        if nodes > limits.max_nodes:
            raise DocumentError([(path, f"more than {limits.max_nodes} values")])
        if isinstance(value, _LongNumber):
            raise DocumentError(
                [(path, f"a number of {value.digits} characters (at most {MAX_DIGITS})")]
            )
        if not isinstance(value, list):
            return value
        if depth > limits.max_depth:
            raise DocumentError(
                [(shortened_path(path), f"nested more than {limits.max_depth} levels deep")]
            )
        if not isinstance(value, _Pairs):
            return [None] * len(value)
        members: dict[str, Any] = {}
        for key, _ in value:
            if key in members:
                raise DocumentError([(join_path(path, key), "duplicate key")])
            members[key] = None
        return members

    result = shell(root, "", 1)
    stack: list[tuple[list[Any], Any, str, int]] = []
    if isinstance(root, list):
        stack.append((root, result, "", 1))
    while stack:
        source, target, path, depth = stack.pop()
        items = source if isinstance(source, _Pairs) else enumerate(source)
        for key, child in items:
            child_path = join_path(path, key)
            target[key] = shell(child, child_path, depth + 1)
            if isinstance(child, list):
                stack.append((child, target[key], child_path, depth + 1))
    return result


def load_json(text: str | bytes, limits: DocumentLimits = SPEC_LIMITS) -> Any:
    """The plain data of a JSON document, within ``limits``; duplicate keys refused.

    ``NaN`` and ``Infinity`` are read as floats (Python's reading): whoever uses the data
    checks numbers are finite where it needs them to be, and can name the field.
    """
    data = encoded(text, limits)
    try:
        raw = json.loads(data, object_pairs_hook=_Pairs, parse_int=_parse_int)
    except DocumentError:
        raise
    except json.JSONDecodeError as exc:
        raise DocumentError(
            [("", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")]
        ) from None
    except RecursionError:
        raise DocumentError([("", f"nested more than {limits.max_depth} levels deep")]) from None
    except ValueError as exc:
        raise DocumentError([("", f"invalid JSON: {exc}")]) from None
    return _to_plain(raw, limits)
