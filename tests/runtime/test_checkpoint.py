"""Durable checkpoints: complete or absent, even when the writer is SIGKILLed."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.tmpfs import mounted_tmpfs
from tidal.runtime.checkpoint import list_checkpoints, load_latest, save_atomic

WRITER = """
import sys, torch
from tidal.runtime.checkpoint import save_atomic
big = torch.arange(2_000_000, dtype=torch.float64)
step = 0
while True:
    step += 1
    save_atomic({"step": step, "weights": big + step}, sys.argv[1], step, keep=3)
"""


def test_keeps_the_newest_and_loads_the_latest(tmp_path: Path) -> None:
    for step in (3, 10, 7):
        save_atomic({"step": step}, tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-000000007.pt",
        "checkpoint-000000010.pt",
    ]
    state = load_latest(tmp_path)
    assert state is not None and state["step"] == 10


def test_an_unreadable_newest_file_falls_back_to_the_previous(tmp_path: Path) -> None:
    save_atomic({"step": 1}, tmp_path, 1)
    (tmp_path / "checkpoint-000000002.pt").write_bytes(b"not a checkpoint")
    state = load_latest(tmp_path)
    assert state is not None and state["step"] == 1


@pytest.mark.slow  # three writer processes, each importing torch
def test_no_checkpoint_is_half_written_when_the_writer_is_killed(tmp_path: Path) -> None:
    for delay in (0.0, 0.05, 0.13):
        folder = tmp_path / f"kill-{delay}"
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)])
        try:
            deadline = time.monotonic() + 60
            while not list_checkpoints(folder) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(delay)  # land somewhere inside a later write
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=10)
        assert list_checkpoints(folder), "the writer never completed a checkpoint"
        for path in list_checkpoints(folder):
            state = torch.load(path, weights_only=True)
            assert torch.equal(state["weights"], torch.arange(2_000_000) + state["step"])
        assert all(p.suffix in (".pt", ".tmp") for p in folder.iterdir())


def test_checkpoints_are_private_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        path = save_atomic({"x": 1}, tmp_path / "ckpt", step=3)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_checkpoint_that_finds_the_disk_full_leaves_nothing(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "small", size_mb=1) as folder:
        big = {"w": torch.zeros(1 << 19)}  # 2 MiB: more than the disk holds
        with pytest.raises(Exception) as raised:
            save_atomic(big, folder, step=1)
        # torch's writer raises a RuntimeError from the OSError.
        error: BaseException | None = raised.value
        while error is not None and not isinstance(error, OSError):
            error = error.__cause__ or error.__context__
        assert isinstance(error, OSError) and error.errno == errno.ENOSPC, raised.value
        assert list(folder.iterdir()) == []
