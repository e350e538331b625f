"""Where in a YAML spec each of its problems is: the line of the field a problem names.

A refused spec's problems name fields by path (``roles[1].replicas.min``); the API and
the dashboard show each next to the line that wrote it. :mod:`tidal.spec` re-exports
:func:`locate_problems`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml

from tidal.documents import compose_yaml
from tidal.documents_bounds import SPEC_LIMITS, DocumentError

__all__ = ["locate_problems"]


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
