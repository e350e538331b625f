"""Which ``tidal submit`` flag set which spec field, so that a refused value is told as the
flag the user typed (``--workers: must be ≥ 1``) rather than as the field it became
(``workers.min: ...``). Pure: a light import for ``tidal --help``."""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["SPEC_FLAGS", "flag_problems"]

#: Spec field (or the start of a path) → the flag that sets it, most specific first.
SPEC_FLAGS: tuple[tuple[str, str], ...] = (
    ("workers.min", "--min-workers"),
    ("workers.max", "--max-workers"),
    ("workers", "--workers"),
    ("resources.gpus", "--gpus"),
    ("priority", "--priority"),
    ("labels", "--label"),
    ("env", "--env"),
    ("target.group", "--group"),
    ("restart.max_restarts", "--max-restarts"),
    ("working_dir", "--working-dir"),
    ("checkpoint_dir", "--checkpoint-dir"),
    ("launcher", "--launcher"),
    ("name", "--name"),
    ("command", "ARGS"),
)


def _flag(path: str, given: Collection[str]) -> str | None:
    for field, flag in SPEC_FLAGS:
        if path == field or path.startswith((field + ".", field + "[")):
            if flag in given:
                return flag
            # A range typed as --workers MIN:MAX sets min and max through --workers.
            if field.startswith("workers.") and "--workers" in given:
                return "--workers"
    return None


def flag_problems(
    problems: Sequence[tuple[str, str]], given: Collection[str]
) -> list[tuple[str, str]]:
    """``problems`` (``(spec path, message)``) with each path a flag of ``given`` set told
    as that flag; the others (fields a spec file set) keep their path."""
    return [(_flag(path, given) or path, message) for path, message in problems]
