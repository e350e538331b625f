"""Workers' output to their log files: lines split at a bound, logs rotated, and a failing
disk that drops lines instead of blocking the reader."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.tmpfs import fill, mounted_tmpfs
from tidal.launch import log_sink
from tidal.launch.log_sink import MAX_LINE_CHARS, RotatingLog, pump_lines


def test_a_long_line_is_split_at_the_bound() -> None:
    got: list[str] = []
    text = "a" * (2 * MAX_LINE_CHARS + 5) + "\nshort\n"
    pump_lines(io.StringIO(text), got.append, "w0")
    assert [len(line) for line in got] == [MAX_LINE_CHARS + 1, MAX_LINE_CHARS + 1, 6, 6]
    assert all(line.endswith("\n") for line in got)
    assert got[-1] == "short\n"


def test_a_failing_handler_does_not_stop_the_reader() -> None:
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        raise RuntimeError("boom")

    pump_lines(io.StringIO("1\n2\n3\n"), on_line, "w0")
    assert seen == ["1\n", "2\n", "3\n"]


def test_logs_are_rotated_at_their_size(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    sink = RotatingLog(path, max_bytes=100, backups=2)
    for i in range(40):
        sink.write(f"line {i:04d}\n")  # 10 bytes each: 10 a file
    sink.close()
    assert path.read_text().splitlines()[-1] == "line 0039"
    assert path.with_name("worker-0.log.1").read_text().splitlines()[-1] == "line 0029"
    assert path.with_name("worker-0.log.2").read_text().splitlines()[-1] == "line 0019"
    assert not path.with_name("worker-0.log.3").exists()
    for file in tmp_path.iterdir():
        assert file.stat().st_size <= 100
        assert (file.stat().st_mode & 0o777) == 0o600


def test_without_backups_a_full_log_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    sink = RotatingLog(path, max_bytes=100, backups=0)
    for i in range(15):
        sink.write(f"line {i:04d}\n")
    sink.close()
    assert path.read_text().splitlines() == [f"line {i:04d}" for i in range(10, 15)]


def test_a_sink_that_fails_drops_lines_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "worker-0.log"
    sink = RotatingLog(path)
    real_write = os.write
    full = threading.Event()
    full.set()

    def write(fd: int, data: bytes | memoryview) -> int:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr("tidal.launch.log_sink.os.write", write)
    monkeypatch.setattr(log_sink, "_RETRY_S", 0.0)
    sink.write("before\n")
    for i in range(1000):
        sink.write(f"lost {i}\n")
    assert sink.dropped == 1001
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1  # once, not a line each
    full.clear()  # space again
    sink.write("after\n")
    sink.close()
    assert path.read_text().splitlines() == [
        "[tidal: 1001 lines dropped: the log was not writable]",
        "after",
    ]


def test_a_line_a_full_disk_cut_is_ended_before_the_notice(tmp_path: Path) -> None:
    """On a real full disk a write may stop part way through a line: the notice of the
    dropped lines still starts a line of its own, and writing resumes once space is freed."""
    with mounted_tmpfs(tmp_path / "small", size_mb=1) as folder:
        sink = RotatingLog(folder / "worker-0.log")
        sink.write("before\n")
        filler = fill(folder)
        line = "x" * 10_000 + "\n"  # more than the file's last page holds
        for _ in range(10):
            sink.write(line)
        assert sink.dropped >= 1
        dropped = sink.dropped
        filler.unlink()
        until = time.monotonic() + 60
        while sink.dropped == dropped or "after" not in (folder / "worker-0.log").read_text():
            assert time.monotonic() < until, "writing did not resume"
            sink.write("after\n")  # dropped within the retry time, then written
            time.sleep(0.05)
        sink.close()
        lines = (folder / "worker-0.log").read_text().splitlines()
    notices = [n for n, text in enumerate(lines) if "lines dropped" in text]
    assert len(notices) == 1 and lines[notices[0]].startswith("[tidal: "), lines[-3:]
    assert lines[0] == "before" and lines[-1] == "after"


@pytest.mark.slow
def test_a_full_disk_never_blocks_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker writes 8 MiB (far more than a pipe holds) while its log cannot be
    written: the reader drains it all and the worker ends."""

    def write(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("tidal.launch.log_sink.os.write", write)
    sink = RotatingLog(tmp_path / "worker-0.log")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfor _ in range(8192): sys.stdout.write('z' * 1023 + '\\n')",
        ],
        stdout=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    assert worker.stdout is not None
    reader = threading.Thread(target=pump_lines, args=(worker.stdout, sink.write, "w0"))
    reader.start()
    assert worker.wait(timeout=60) == 0
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert sink.dropped == 8192


def test_the_ray_backend_cuts_long_lines_at_the_same_bound() -> None:
    pytest.importorskip("ray")
    from tidal.backends.ray.worker import RayProcess

    got: list[str] = []
    process = RayProcess(actor=None, start=None, on_line=got.append, name="w0")
    for _ in range(5):  # a line without end, arriving in polls of 50 Ki characters
        process._deliver("y" * 50 * 1024)
    process._deliver("\nshort\n\n")
    assert [len(line) for line in got] == [MAX_LINE_CHARS + 1] * 3 + [
        5 * 50 * 1024 - 3 * MAX_LINE_CHARS + 1,
        6,
        1,
    ]
