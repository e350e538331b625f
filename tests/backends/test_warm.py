"""Warm worker starts: a pre-started interpreter runs the script as a cold start would."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tidal.launch.failure_cause import last_exception
from tidal.launch.limits import WorkerLimits
from tidal.launch.process import LocalProcess
from tidal.launch.warm import ENV_WARM_POOL, READY_LINE, WarmSpawner, warm_pool_size

pytestmark = pytest.mark.slow

SCRIPT = """\
import json, os, sys
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "seed": os.environ.get("SEED"),
    "pid": os.getpid(),
    "torch": "torch" in sys.modules,
    "preloaded": "xml.dom.minidom" in sys.modules,
    "stdin": sys.stdin.read(),
}), flush=True)
if sys.argv[1:] == ["--wait"]:
    import time
    time.sleep(60)
sys.exit(3)
"""


class Lines:
    """A worker's output lines, as the group's log follower receives them."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)


def _spawn(spawner: WarmSpawner, script: Path, cwd: Path, *args: str) -> tuple[LocalProcess, Lines]:
    out = Lines()
    process = spawner.spawn(
        worker_id="w0",
        slot="h:0",
        argv=["python", str(script), *args],
        env={"SEED": "7", "PYTHONUNBUFFERED": "1"},
        cwd=str(cwd),
        on_line=out,
    )
    return process, out


def test_a_warm_worker_runs_like_a_cold_one(tmp_path: Path) -> None:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    # The pool imports ahead what the script's command says it will (here a standard
    # module nothing else imports); the worker then runs with its own environment only.
    spawner = WarmSpawner(1, preload=["xml.dom.minidom", "no_such_module"], env={"JOB_WIDE": "1"})
    try:
        taken = spawner._ready[0]
        process, out = _spawn(spawner, script, work, "--epochs", "2")
        assert process.pid == taken.pid  # the warm interpreter is the worker
        assert process.wait(timeout=120) == 3
        process.drain(timeout=10)
        seen = json.loads(out.lines[0])
        assert seen == {
            "name": "__main__",
            "argv": [str(script), "--epochs", "2"],
            "cwd": str(work),
            "path0": str(script.parent),
            "seed": "7",
            "pid": taken.pid,
            "torch": True,  # imported before the order came
            "preloaded": True,  # a module that fails to import ahead is left to the script
            "stdin": "",
        }
        # Killed like a cold worker: its whole session, at once.
        process, out = _spawn(spawner, script, work, "--wait")
        deadline = time.monotonic() + 120
        while not out.lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.lines, "the second worker did not start"
        process.kill()
        assert process.wait(timeout=10) == -9
        left = list(spawner._ready)
    finally:
        spawner.close()
    assert left and all(p.poll() is not None for p in left)  # the pool's spares end too


def test_the_pool_says_when_its_imports_are_done(tmp_path: Path) -> None:
    # wait_warm reads each interpreter's ready line; the worker's output never holds it,
    # read or not (the test above takes an interpreter whose line nobody read).
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spawner = WarmSpawner(2, preload=["xml.dom.minidom"])
    try:
        assert spawner.wait_warm(120) == 2
        assert spawner.wait_warm(0) == 2  # nothing left to read: at once
        process, out = _spawn(spawner, script, tmp_path)
        assert process.wait(timeout=120) == 3
        process.drain(timeout=10)
        assert READY_LINE not in "".join(out.lines)
        assert json.loads(out.lines[0])["preloaded"] is True
        # Those that died while waiting are not warm.
        for taken in spawner._ready:
            taken.kill()
            taken.wait()
        assert spawner.wait_warm(120) == 0
    finally:
        spawner.close()


def test_the_pool_remembers_only_the_interpreters_still_warm(tmp_path: Path) -> None:
    # A pid whose interpreter was taken or died may come back as another process's.
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spawner = WarmSpawner(1)
    taken: list[int] = []
    try:
        for _ in range(3):
            assert spawner.wait_warm(120) == 1
            process, out = _spawn(spawner, script, tmp_path)
            taken.append(process.pid)
            assert process.wait(timeout=120) == 3
            process.drain(timeout=10)
            assert READY_LINE not in "".join(out.lines)
        assert spawner.wait_warm(120) == 1
        assert spawner._warm == {spawner._ready[0].pid}
        assert spawner._warm.isdisjoint(taken)
        spawner._ready[0].kill()
        spawner._ready[0].wait()
        assert spawner.wait_warm(120) == 0
        assert spawner._warm == set()
    finally:
        spawner.close()


def test_other_commands_start_cold(tmp_path: Path) -> None:
    spawner = WarmSpawner(1)
    try:
        warm = spawner._ready[0].pid
        out = Lines()
        process = spawner.spawn(
            worker_id="w0",
            slot="h:0",
            argv=[sys.executable, "-c", "import os; print(os.getpid())"],
            env={},
            cwd=str(tmp_path),
            on_line=out,
        )
        assert process.wait(timeout=60) == 0
        process.drain(timeout=10)
        assert process.pid != warm
        assert spawner._ready[0].pid == warm  # still waiting for a script
        assert int(out.lines[0]) == process.pid
        # An interpreter start-up variable the pool did not start with: cold as well.
        script = tmp_path / "x.py"
        script.write_text("pass\n")
        process = spawner.spawn(
            worker_id="w1",
            slot="h:0",
            argv=["python", str(script)],
            env={"PYTHONHASHSEED": "1"},
            cwd=str(tmp_path),
            on_line=Lines(),
        )
        assert process.wait(timeout=60) == 0
        assert process.pid != warm
        assert spawner._ready[0].pid == warm
    finally:
        spawner.close()


def test_a_pool_not_filled_yet_starts_workers_cold(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("import os; print(os.getpid())\n")
    spawner = WarmSpawner(2, fill=False)
    try:
        assert spawner._ready == []
        out = Lines()
        process = spawner.spawn(
            worker_id="w0",
            slot="h:0",
            argv=["python", str(script)],
            env={},
            cwd=None,
            on_line=out,
        )
        assert process.wait(timeout=60) == 0
        assert spawner._ready == []  # a cold start does not fill the pool
        spawner.fill()
        spawner.fill()  # once
        assert len(spawner._ready) == 2
    finally:
        spawner.close()
    spawner.fill()  # closed: nothing starts
    assert spawner._ready == []


def test_pool_size_from_the_environment() -> None:
    assert warm_pool_size({}) == 0
    assert warm_pool_size({ENV_WARM_POOL: "2"}) == 2
    with pytest.raises(ValueError, match=ENV_WARM_POOL):
        warm_pool_size({ENV_WARM_POOL: "many"})
    with pytest.raises(ValueError, match="size"):
        WarmSpawner(0)
    assert os.environ.get(ENV_WARM_POOL) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs")
def test_a_warm_worker_takes_its_cpus_and_memory_limit(tmp_path: Path) -> None:
    """A worker handed to a warm interpreter is held to its limits as a cold one is."""
    script = tmp_path / "greedy.py"
    script.write_text(
        "import os\n"
        "print('cpus', sorted(os.sched_getaffinity(0)), flush=True)\n"
        "x = bytearray(8 << 30)\n"
    )
    limits = WorkerLimits(cpus=1, memory=6 << 30).env()
    spawner = WarmSpawner(1)
    try:
        taken = spawner._ready[0]
        out = Lines()
        process = spawner.spawn(
            worker_id="w1",
            slot="h:1",
            argv=["python", str(script)],
            env={"PYTHONUNBUFFERED": "1", **limits},
            cwd=str(tmp_path),
            on_line=out,
        )
        assert process.pid == taken.pid  # it ran warm
        assert process.wait(timeout=120) == 1
        process.drain(timeout=10)
    finally:
        spawner.close()
    text = "".join(out.lines)
    assert f"cpus [{sorted(os.sched_getaffinity(0))[1]}]" in text, text
    assert last_exception(text) == "MemoryError", text


GATED_MODULE = """\
import os, time
# Imported ahead by the pool: its imports last until the test opens the gate.
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.05)
"""


def test_a_worker_takes_an_interpreter_while_the_pool_is_waited_for(tmp_path: Path) -> None:
    """wait_warm never holds the pool: a worker that takes an interpreter still importing
    is handed to it at once, and goes on once the imports end."""
    (tmp_path / "gated_import.py").write_text(GATED_MODULE)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    gate = tmp_path / "gate"
    env = {"PYTHONPATH": str(tmp_path), "GATE": str(gate)}
    spawner = WarmSpawner(1, preload=["gated_import"], env=env)
    waited: list[int] = []
    waiter = threading.Thread(target=lambda: waited.append(spawner.wait_warm(120)))
    try:
        taken = spawner._ready[0]
        waiter.start()
        spawned: list[tuple[LocalProcess, Lines]] = []

        def spawn() -> None:
            out = Lines()
            process = spawner.spawn(
                worker_id="w0",
                slot="h:0",
                argv=["python", str(script)],
                env={**env, "SEED": "7", "PYTHONUNBUFFERED": "1"},
                cwd=str(tmp_path),
                on_line=out,
            )
            spawned.append((process, out))

        spawning = threading.Thread(target=spawn)
        spawning.start()
        spawning.join(timeout=60)  # the gate is shut: it can only return if not held
        assert spawned, "the take waited for the interpreter's imports"
        process, out = spawned[0]
        assert process.pid == taken.pid
        assert process.poll() is None  # still importing
        gate.touch()
        assert process.wait(timeout=120) == 3
        process.drain(timeout=10)
        waiter.join(timeout=60)
        assert waited == [0]  # the taken one is not counted
        assert READY_LINE not in "".join(out.lines)
        assert json.loads(out.lines[0])["seed"] == "7"
    finally:
        gate.touch()
        spawner.close()
