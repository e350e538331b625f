"""The installed packages a job's script imports, read from its syntax tree.

A warm interpreter (:mod:`tidal.launch.warm`) imports them ahead, under the job's
environment, so a worker handed to it skips them too: a team runs the same scripts
again, and a package such as scikit-learn costs a newcomer seconds. Only what the script
imports at its top level counts (an import inside a function may never run), and modules
found beside the script are left out: they are the user's own, and importing them may do
work.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

__all__ = ["script_imports"]


def _top_level_imports(tree: ast.Module) -> list[str]:
    names: list[str] = []
    # The module's own statements, and those under a top-level ``try``/``if`` (optional
    # imports); nothing inside functions, which may never run.
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, (ast.Try, ast.If)):
            pending.extend(node.body)
    return names


def script_imports(argv: Sequence[str], working_dir: Path | None = None) -> list[str]:
    """The installed modules a ``python script.py`` command's script imports at its top
    level, in order, for the pool to import ahead (empty for any other command, or a
    script that cannot be read or parsed). A script named relative to the job's
    ``working_dir`` is read there. Modules found beside the script are left out."""
    if len(argv) < 2 or not argv[1].endswith(".py"):
        return []
    script = Path(argv[1])
    if working_dir is not None and not script.is_absolute():
        script = working_dir / script
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    folder = script.resolve().parent
    found: list[str] = []
    for name in _top_level_imports(tree):
        top = name.partition(".")[0]
        if name in found or top == "__future__":
            continue
        if (folder / f"{top}.py").exists() or (folder / top).is_dir():
            continue  # the user's own module
        try:
            installed = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            installed = False
        if installed:
            found.append(name)
    return found
