"""Bad input to ``tidal run`` / ``tidal resize``: one line naming the argument, status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py")


def _tidal(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, TIDAL_HOME=str(home)),
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["run", "--workers", "1:2", "--", "missing.py"], "SCRIPT"),
        (["run", "--workers", "4:2", "--", EXAMPLE], "--workers"),
        (["run", "--workers", "-1:2", "--", EXAMPLE], "--workers"),
        (["run", "--workers", "a:b", "--", EXAMPLE], "--workers"),
        (["run", "--workers", "1:2:3", "--", EXAMPLE], "--workers"),
        (["run", "--workers", "1:2", "--initial", "5", "--", EXAMPLE], "--initial"),
        (["run", "--workers", "1:2", "--initial", "x", "--", EXAMPLE], "--initial"),
        (["run", "--workers", "1:2", "--resize-at", "5", "--", EXAMPLE], "--resize-at"),
        (["run", "--workers", "1:2", "--timeout", "0", "--", EXAMPLE], "--timeout"),
        (["resize", "no-such-run", "--workers", "2"], "RUN"),
        (["resize", "some-run"], "--workers"),
        (["resize", "no-such-run", "2"], "RUN"),
        (["resize", "some-run", "2", "--workers", "3"], "--workers"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args: list[str], names: str, tmp_path: Path) -> None:
    result = _tidal(*args, home=tmp_path)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert names in lines[0], lines[0]
    assert result.stdout == ""
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    "args",
    [["3"], ["--workers", "3"], ["3", "--workers", "3"]],
    ids=["positional", "flag", "both-agreeing"],
)
def test_resize_takes_the_count_as_argument_or_flag(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidal.runtime.rendezvous as rendezvous
    from tidal.cli.main import app, run_app
    from tidal.launch.runs import RunRecord, register

    monkeypatch.setenv("TIDAL_HOME", str(tmp_path))
    register(RunRecord("r1", os.getpid(), "127.0.0.1:29500", 1, 4))
    asked: list[int] = []
    monkeypatch.setattr(rendezvous, "connect_store", lambda host, port, timeout: (host, port))

    def request_resize(store: object, n: int) -> int:
        asked.append(n)
        return 7

    monkeypatch.setattr(rendezvous, "request_resize", request_resize)
    assert run_app(app, ["resize", "r1", *args]) == 0
    assert asked == [3]
    # Out of the run's bounds: refused naming what was given, nothing asked.
    assert run_app(app, ["resize", "r1", "5"]) == 2
    assert asked == [3]
