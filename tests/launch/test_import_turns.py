"""Import turns: a pool's spare interpreters import one at a time, and one handed a
worker goes ahead without waiting for its turn."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tidal.launch.import_turns import ImportTurns
from tidal.launch.warm import READY_LINE, WarmSpawner

pytestmark = pytest.mark.slow


@contextmanager
def holding(turn: Path) -> Iterator[None]:
    """Hold ``turn`` as an importing interpreter would."""
    fd = os.open(turn, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_turns_read_back_from_the_command_line(tmp_path: Path) -> None:
    turns = ImportTurns(tmp_path / "a:b", 3)
    args = [turns.argument(), "numpy"]
    assert ImportTurns.parse(args) == turns
    assert args == ["numpy"]
    assert ImportTurns.parse(args) is None
    assert ImportTurns.for_host(tmp_path).count == max(1, len(os.sched_getaffinity(0)) // 2)
    with pytest.raises(ValueError, match="count"):
        ImportTurns(tmp_path, 0)


def test_an_interpreter_imports_in_its_turn(tmp_path: Path) -> None:
    turns = ImportTurns(tmp_path / "turns", 1)
    turns.folder.mkdir()
    with holding(turns.folder / "turn-0.lock"):
        spawner = WarmSpawner(2, turns=turns)
        # Neither can import while the only turn is held, however long it waits.
        assert spawner.wait_warm(3) == 0
    try:
        assert spawner.wait_warm(120) == 2  # one after the other, once it is free
    finally:
        spawner.close()


def test_a_taken_interpreter_does_not_wait_for_its_turn(tmp_path: Path) -> None:
    turns = ImportTurns(tmp_path / "turns", 1)
    turns.folder.mkdir()
    script = tmp_path / "train.py"
    script.write_text("import json, sys; print(json.dumps(sorted(sys.argv[1:])), flush=True)\n")
    lines: list[str] = []
    lock = threading.Lock()

    def on_line(line: str) -> None:
        with lock:
            lines.append(line)

    with holding(turns.folder / "turn-0.lock"):
        spawner = WarmSpawner(2, refill=False, turns=turns)  # as a standby keeps it
        try:
            taken = spawner._ready[0]
            process = spawner.spawn(
                worker_id="w0",
                slot="h:0",
                argv=["python", str(script), "--x"],
                env={"PYTHONUNBUFFERED": "1"},
                cwd=str(tmp_path),
                on_line=on_line,
            )
            assert process.pid == taken.pid
            # It runs its script while the turn is still held here.
            assert process.wait(timeout=120) == 0
            process.drain(timeout=10)
            assert spawner.wait_warm(1) == 0  # the other still waits for a turn
            # Once the job keeps the pool, it is the job's: the one left goes ahead, and
            # the one started to refill it imports without a turn.
            spawner.keep(2)
            assert spawner.wait_warm(120) == 2
        finally:
            spawner.close()
    assert json.loads(lines[0]) == ["--x"]
    assert READY_LINE not in "".join(lines)


def test_a_pool_handed_to_a_job_imports_without_turns(tmp_path: Path) -> None:
    # What a standby does once it is handed a job: its interpreters are the job's pool.
    turns = ImportTurns(tmp_path / "turns", 1)
    turns.folder.mkdir()
    with holding(turns.folder / "turn-0.lock"):
        spawner = WarmSpawner(2, refill=False, turns=turns)
        try:
            assert spawner.wait_warm(1) == 0
            spawner.end_turns()
            assert spawner.wait_warm(120) == 2  # the turn is still held here
        finally:
            spawner.close()
