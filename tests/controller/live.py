"""A real ``tidal server`` subprocess (local backend, real workers) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def start_server(
    tmp_path: Path, *args: str, slots: int = 4, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``tidal server`` on ``tmp_path/data`` and wait until it serves; ``env``
    adds to its environment (and its agents')."""
    data = tmp_path / "data"
    (data / "server.json").unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "server",
            "--slots",
            str(slots),
            "--data-dir",
            str(data),
            # No standby agent (its pool's imports at every start) unless ``args`` ask.
            "--standby-workers",
            "0",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "a"),  # noqa: SIM115
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TIDAL_HOME=str(tmp_path / "home"), **(env or {})),
    )
    deadline = time.monotonic() + 60
    while not (data / "server.json").exists():
        assert process.poll() is None, "server exited at start"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    return process


def stop_server(process: subprocess.Popen[str]) -> None:
    """SIGINT (jobs are released, agents end), then SIGKILL if it does not stop in time."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
