"""What a standby agent's interpreters import ahead: the installed packages the latest
jobs' scripts imported (pure: no process is started); and what a job's agent is handed of
its script's imports, read once by the backend."""

from __future__ import annotations

from pathlib import Path

from tidal.backends.local import LocalBackend
from tidal.backends.local_standby import Standby
from tidal.launch.agent_config import AgentConfig
from tidal.launch.api import JobLaunch
from tidal.launch.script_imports import script_imports


def test_a_standby_learns_what_the_latest_scripts_import(tmp_path: Path) -> None:
    # A script named relative to its job's working dir is read there; the newest job's
    # imports come first; what sits beside the script (the user's own) is left out.
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import json\nimport helpers\nfrom xml.dom import minidom\n")
    (work / "helpers.py").write_text("")
    (tmp_path / "other.py").write_text("import csv\nimport json\n")
    standby = Standby(tmp_path, 2)
    standby.learn(script_imports(["python", "train.py", "--epochs", "3"], work))
    assert standby.preload == ("json", "xml.dom")
    standby.learn(script_imports(["python", str(tmp_path / "other.py")]))
    # mypy keeps preload narrowed to the 2-tuple of the assert above across learn().
    assert standby.preload == ("csv", "json", "xml.dom")  # type: ignore[comparison-overlap]
    standby.learn(script_imports(["python", "-m", "package"], work))  # nothing: unchanged
    assert standby.preload == ("csv", "json", "xml.dom")  # type: ignore[comparison-overlap]
    off = Standby(tmp_path, 0)
    off.learn(script_imports(["python", "train.py"], work))
    assert off.preload == ()


def test_the_agent_is_handed_what_the_script_imports(tmp_path: Path) -> None:
    # The backend reads the script (named relative to the job's working dir) once; the
    # job's agent finds the list in its launch config instead of reading the script again.
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import json\nimport helpers\nfrom xml.dom import minidom\n")
    (work / "helpers.py").write_text("")
    launch = JobLaunch(job_id="j", argv=("python", "train.py"), working_dir=work)
    backend = LocalBackend(tmp_path / "data")
    try:
        backend.start(launch, [("local", 0)])
        text = (tmp_path / "data" / "agents" / "j.launch.json").read_text()
    finally:
        backend.close()
    assert AgentConfig.from_json(text).preload == ["json", "xml.dom"]
    # A config an earlier release wrote has no list: the agent reads the script itself.
    bare = AgentConfig(launch=launch, slots=["local:0"])
    assert AgentConfig.from_json(bare.to_json()).preload is None
