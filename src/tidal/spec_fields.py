"""The value types of a job spec's fields: strict, bounded, and safe to store and pass on.

Types are strict (``true`` is not 1 and ``"7"`` is not 7; the only strings read as numbers
are the shorthands ``workers: 1:8`` and ``memory: 4Gi``, in ASCII digits); numbers are
finite and bounded so they fit the store; text is bounded in length and free of NUL
characters and lone surrogates, which no process argument, file name or JSON document can
carry. :mod:`tidal.spec` builds the spec's models from these.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Annotated, Any

from pydantic import AfterValidator, Field, Strict

__all__ = [
    "ENV_RE",
    "MAX_ARGS",
    "MAX_ARG_TEXT",
    "MAX_CHECKPOINT_SECONDS",
    "MAX_CHECKPOINT_STEPS",
    "MAX_COMMAND_TEXT",
    "MAX_CPUS",
    "MAX_ENV",
    "MAX_ENV_KEY",
    "MAX_ENV_VALUE",
    "MAX_GROUP_TEXT",
    "MAX_LABELS",
    "MAX_LABEL_KEY",
    "MAX_LABEL_VALUE",
    "MAX_MEMORY",
    "MAX_PATH_TEXT",
    "MAX_RESTARTS",
    "MAX_WORKERS",
    "NAME_RE",
    "Arg",
    "Count",
    "EnvValue",
    "GroupText",
    "Labels",
    "PathText",
    "parse_memory",
    "parse_workers_range",
    "shown",
    "text_problem",
]

#: Job names become part of job ids, directory names and URLs: keep them boring.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ASCII digits only (``\d`` would take full-width and Arabic-Indic digits too); all these
# patterns are used with fullmatch, so a trailing newline is not ignored as ``$`` would.
_MEMORY_RE = re.compile(r"[ \t]*([0-9]+)(?:\.([0-9]+))?[ \t]*([KMGT]i?)?B?[ \t]*", re.IGNORECASE)
_WORKERS_RE = re.compile(r"[ \t]*([0-9]{1,20})[ \t]*(?::[ \t]*([0-9]{1,20})[ \t]*)?")
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

#: Upper bounds: generous for any real job, and all far below 2^63 so the store holds them.
MAX_WORKERS = 100_000
MAX_MEMORY = 2**60
MAX_CPUS = 4096.0
MAX_RESTARTS = 1_000_000_000
MAX_CHECKPOINT_STEPS = 10**15
MAX_CHECKPOINT_SECONDS = 10.0**9
#: Length bounds, in characters (entries for lists and mappings).
MAX_COMMAND_TEXT = 32 * 1024
MAX_ARGS = 1024
MAX_ARG_TEXT = 32 * 1024
MAX_ENV = 256
MAX_ENV_KEY = 255
MAX_ENV_VALUE = 32 * 1024
MAX_LABELS = 64
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 255
MAX_PATH_TEXT = 4096
MAX_GROUP_TEXT = 63


def text_problem(value: str, *, single_line: bool = False) -> str | None:
    """Why ``value`` cannot be stored and handed to processes, or ``None`` if it can.

    NUL ends a C string (an argument, a path); a lone surrogate cannot be encoded as UTF-8
    (nor sent as JSON). ``single_line`` also refuses control characters (newlines, tabs),
    for text shown in tables and matched exactly, such as labels.
    """
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = repr(value[exc.start])[1:-1]
        return f"must be valid Unicode text (lone surrogate {bad} at position {exc.start})"
    if single_line and not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"must not contain control characters (got {bad!r})"
    return None


def _safe_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _safe_line(value: str) -> str:
    problem = text_problem(value, single_line=True)
    if problem is not None:
        raise ValueError(problem)
    return value


def shown(value: Any) -> str:
    """``value`` for an error message: short, and safe to encode (escapes, no surrogates)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 128:
        return "a number of more than 38 digits"
    text = repr(value)
    if not text.isascii():
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= 40 else text[:37] + "..."


def _check_label_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        problem = text_problem(key, single_line=True)
        if problem is None and not 1 <= len(key) <= MAX_LABEL_KEY:
            problem = f"must be 1-{MAX_LABEL_KEY} characters"
        if problem is not None:
            raise ValueError(f"key {shown(key)}: {problem}")
    return value


Count = Annotated[int, Strict()]
Arg = Annotated[str, Strict(), Field(max_length=MAX_ARG_TEXT), AfterValidator(_safe_text)]
EnvValue = Annotated[str, Strict(), Field(max_length=MAX_ENV_VALUE), AfterValidator(_safe_text)]
LabelValue = Annotated[str, Strict(), Field(max_length=MAX_LABEL_VALUE), AfterValidator(_safe_line)]
PathText = Annotated[str, Strict(), Field(max_length=MAX_PATH_TEXT), AfterValidator(_safe_text)]
GroupText = Annotated[str, Strict(), Field(max_length=MAX_GROUP_TEXT), AfterValidator(_safe_line)]
Labels = Annotated[
    dict[str, LabelValue], Field(max_length=MAX_LABELS), AfterValidator(_check_label_keys)
]


def parse_memory(value: str | int) -> int:
    """Bytes from ``4Gi``, ``512M``, ``1024`` and the like; raises ``ValueError`` otherwise.

    Exact (no float rounding) and at most :data:`MAX_MEMORY`; a fraction of a byte is
    dropped.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(
            f"expected a size like 4Gi or a whole number of bytes (got {shown(value)})"
        )
    if isinstance(value, int):
        amount = value
    else:
        match = _MEMORY_RE.fullmatch(value) if len(value) <= 64 else None
        if not match:
            raise ValueError(f"not a memory size (got {shown(value)}; use e.g. 512Mi, 4Gi, 2G)")
        whole, fraction, unit = match.groups()
        number = Fraction(int(whole + (fraction or "")), 10 ** len(fraction or ""))
        amount = math.floor(number * _MEMORY_UNITS[(unit or "").lower()])
    if amount < 0:
        raise ValueError("must be ≥ 0")
    if amount > MAX_MEMORY:
        raise ValueError(f"must be at most {MAX_MEMORY} bytes (1Ei) (got {shown(value)})")
    return amount


def parse_workers_range(value: str | int) -> dict[str, int]:
    """``"1:8"`` → ``{"min": 1, "max": 8}``; ``"4"`` or ``4`` → a fixed size of 4.

    Only ASCII digits count as digits.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return {"min": value, "max": value}
    match = _WORKERS_RE.fullmatch(value) if isinstance(value, str) and len(value) <= 64 else None
    if not match:
        raise ValueError(f"expected N or MIN:MAX (got {shown(value)})")
    low, high = match.groups()
    return {"min": int(low), "max": int(high if high is not None else low)}
