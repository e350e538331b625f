"""Reading workers' logs: the tail from the end, bounded; follow reads only new bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tidal.controller.routes.log_files import (
    CUT_MARK,
    MAX_LINE_BYTES,
    TAIL_MAX_BYTES,
    LogFollower,
    tail_lines,
)


def test_tail_of_many_lines(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert tail_lines(path, 3) == ["line 99997", "line 99998", "line 99999"]
    assert tail_lines(path, 0) == []


def test_tail_of_a_huge_file_of_one_line_is_fast_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    with path.open("wb") as f:  # 1 GB, sparse: only the end is read
        f.truncate(1 << 30)
        f.seek((1 << 30) - 3 * MAX_LINE_BYTES)
        f.write(b"y" * 3 * MAX_LINE_BYTES)
    started = time.process_time()
    lines = tail_lines(path, 10)
    assert time.process_time() - started < 0.5  # milliseconds; the old code took minutes
    assert len(lines) == 1
    assert lines[0].startswith(CUT_MARK)
    assert len(lines[0].encode()) <= MAX_LINE_BYTES + len(CUT_MARK.encode())


def test_a_tail_never_reads_more_than_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    long_line = "x" * (2 * MAX_LINE_BYTES)
    path.write_text("first\n" + f"{long_line}\n" * 20 + "last\n")
    lines = tail_lines(path, 100)
    assert sum(len(line) for line in lines) <= TAIL_MAX_BYTES + len(lines) * len(CUT_MARK)
    assert lines[-1] == "last"
    assert all(line.endswith(CUT_MARK) or line.startswith(CUT_MARK) for line in lines[:-1])
    assert "first" not in lines


def test_tail_of_an_empty_or_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "worker-0.log"
    empty.write_bytes(b"")
    assert tail_lines(empty, 10) == []
    assert tail_lines(tmp_path / "worker-9.log", 10) == []


def test_tail_of_a_file_being_appended(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    with path.open("a", buffering=1) as f:
        f.write("one\ntwo\nthr")
        assert tail_lines(path, 2) == ["two", "thr"]
        f.write("ee\n")
        assert tail_lines(path, 2) == ["two", "three"]


def test_follow_reads_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    path.write_text("old\n")
    follower = LogFollower({0: path})
    with path.open("a", buffering=1) as f:
        f.write("new\npart")
        assert follower.read({0: path}) == [(0, "new")]
        f.write("ial\n")
        assert follower.read({0: path}) == [(0, "partial")]
        assert follower.read({0: path}) == []
    follower.close()


def test_follow_cuts_a_line_without_end_and_skips_its_rest(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    path.write_bytes(b"")
    follower = LogFollower({0: path})
    with path.open("ab") as f:
        for _ in range(40):  # 40 MiB of one line, appended while followed
            f.write(b"y" * (1 << 20))
            f.flush()
            for _, line in follower.read({0: path}):
                assert len(line) <= MAX_LINE_BYTES + len(CUT_MARK)
        f.write(b"\nafter\n")
    lines = [line for _, line in follower.read({0: path})]
    assert lines == ["after"]
    follower.close()


def test_follow_goes_on_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    path.write_text("")
    follower = LogFollower({0: path})
    with path.open("a", buffering=1) as f:
        f.write("a\n")
        assert follower.read({0: path}) == [(0, "a")]
        f.write("b\n")  # written before the rotation, not read yet
    os.replace(path, tmp_path / "worker-0.log.1")
    path.write_text("c\n")
    assert follower.read({0: path}) == [(0, "b"), (0, "c")]
    follower.close()
