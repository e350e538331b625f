"""A released worker ends with ``os._exit``: status 75, exit handlers run, files flushed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tidal.runtime.env import EXIT_RELEASED

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    from tidal.runtime.leaving import exit_released

    class Recorder:
        def __init__(self, path):
            self.log = open(path, "w")  # block-buffered: nothing written yet

    def main():
        steps = open(sys.argv[1], "w")
        steps.write("step 1\\n")
        recorder = Recorder(sys.argv[2])
        recorder.log.write("metric 1\\n")
        atexit.register(lambda: print("exit handler ran"))
        try:
            exit_released()
        finally:
            print("finally ran")  # os._exit: never printed
        print("after the exit")

    main()
    """
)


def test_released_process_exits_with_its_status_and_loses_no_output(tmp_path: Path) -> None:
    script = tmp_path / "leave.py"
    script.write_text(SCRIPT)
    steps, metrics = tmp_path / "steps.txt", tmp_path / "metrics.txt"
    done = subprocess.run(
        [sys.executable, str(script), str(steps), str(metrics)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_RELEASED, done.stderr
    assert done.stdout.splitlines() == ["exit handler ran"], done.stdout
    assert steps.read_text() == "step 1\n"
    assert metrics.read_text() == "metric 1\n"
