"""Which modules a warm pool imports ahead for a ``python script.py`` command."""

from __future__ import annotations

from pathlib import Path

from tidal.launch.script_imports import script_imports

SCRIPT = """\
from __future__ import annotations
import os, json
import numpy as np
from sklearn.datasets import load_digits
from . import sibling_relative
import helpers
from mypackage.models import Net
try:
    import yaml
except ImportError:
    yaml = None
if True:
    import email.mime.text
import not_installed_anywhere_xyz


def main():
    import http.server  # inside a function: may never run


if __name__ == "__main__":
    main()
"""


def test_installed_top_level_imports_in_order(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "mypackage").mkdir()
    assert script_imports(["python", str(script), "--epochs", "3"]) == [
        "os",
        "json",
        "numpy",
        "sklearn.datasets",
        "yaml",
        "email.mime.text",
    ]


def test_nothing_for_other_commands_or_unreadable_scripts(tmp_path: Path) -> None:
    assert script_imports(["python", "-c", "import numpy"]) == []
    assert script_imports(["torchrun", "train.py"]) == []
    assert script_imports(["python", str(tmp_path / "missing.py")]) == []
    broken = tmp_path / "broken.py"
    broken.write_text("import (\n")
    assert script_imports(["python", str(broken)]) == []
