"""What a standby agent's interpreters import ahead: the installed packages the latest
jobs' scripts imported (pure: no process is started)."""

from __future__ import annotations

from pathlib import Path

from tidal.backends.local_standby import Standby


def test_a_standby_learns_what_the_latest_scripts_import(tmp_path: Path) -> None:
    # A script named relative to its job's working dir is read there; the newest job's
    # imports come first; what sits beside the script (the user's own) is left out.
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import json\nimport helpers\nfrom xml.dom import minidom\n")
    (work / "helpers.py").write_text("")
    (tmp_path / "other.py").write_text("import csv\nimport json\n")
    standby = Standby(tmp_path, 2)
    standby.learn(["python", "train.py", "--epochs", "3"], work)
    assert standby.preload == ("json", "xml.dom")
    standby.learn(["python", str(tmp_path / "other.py")], None)
    assert standby.preload == ("csv", "json", "xml.dom")
    standby.learn(["python", "-m", "package"], work)  # nothing to read: unchanged
    assert standby.preload == ("csv", "json", "xml.dom")
    off = Standby(tmp_path, 0)
    off.learn(["python", "train.py"], work)
    assert off.preload == ()
