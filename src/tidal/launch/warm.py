"""Warm worker starts: interpreters started ahead, torch already imported.

A cold worker start pays for the interpreter, ``import torch`` and the user's imports
before it can join its job: seconds, and tens of seconds on a loaded host. A
:class:`WarmSpawner` keeps ``size`` interpreters (``python -m tidal.launch.warm``) started
ahead, each a subprocess in its own session exactly as :class:`LocalSpawner` starts a
worker, that imported torch and wait on their stdin. A worker whose command is
``python script.py …`` takes one: the spawner writes the worker's argv, environment and
cwd as one JSON line; the interpreter changes directory, takes that environment, puts the
script's folder first on ``sys.path`` and runs the script as ``__main__`` (``runpy``).
Its pid, session (``killpg``), exit status and output pipe are those of the process the
spawner started, so the group tracks and kills it as any other worker.

Anything else starts cold: a command that is not ``python <file>``, or an environment
whose interpreter start-up variables (``PYTHON*``) differ from the ones the pool started
with (they take effect only at start-up). How many interpreters a job keeps is decided in
:mod:`tidal.launch.warm_plan`; the spawner starts them when :meth:`WarmSpawner.fill` is
called (the agent does once the job's first workers train), and starts workers cold
before that.

On a GPU host the pool's interpreters import torch without initialising CUDA: the
worker's ``CUDA_VISIBLE_DEVICES`` arrives with its order, and CUDA reads it when the
script first uses the GPU. An interpreter whose imports initialised CUDA ends instead of
waiting (its worker then starts cold).

The pool's interpreters also import, ahead, the installed packages the job's script
imports at its top level (``numpy``, ``sklearn.datasets``, ...: found by
:mod:`tidal.launch.script_imports`), under the job's environment, so a taken interpreter
skips those imports too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import runpy
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tidal.launch.file_modes import user_umask
from tidal.launch.import_turns import ImportTurns
from tidal.launch.limits import WorkerLimits, apply_here
from tidal.launch.log_sink import start_pump
from tidal.launch.process import LocalProcess, LocalSpawner, resolve_python, slot_number
from tidal.launch.warm_plan import ENV_WARM_POOL, requested_pool

__all__ = [
    "ENV_WARM_POOL",
    "READY_LINE",
    "WarmSpawner",
    "main",
    "warm_pool_size",
]

log = logging.getLogger(__name__)

#: What the interpreters of the pool are started with on top of this environment; the
#: worker's own environment sets the same (:func:`tidal.launch.worker.worker_env`).
_START_ENV = {"PYTHONUNBUFFERED": "1"}

#: The first line a pool's interpreter writes, once its imports are done: how the pool
#: knows it is warm (:meth:`WarmSpawner.wait_warm`). Never reaches the worker's log.
READY_LINE = "tidal-warm: ready"

#: What an interpreter waiting for its import turn may be told before a worker's order:
#: to import now, without a turn.
GO_LINE = "go"

#: How long :meth:`WarmSpawner.wait_warm` waits on an interpreter's output before it
#: looks again whether the interpreter was taken meanwhile.
_READ_SLICE_S = 0.2


def warm_pool_size(env: Mapping[str, str]) -> int:
    """How many warm interpreters a job's environment asks for (0: none, or unset).

    Raises ``ValueError`` naming :data:`ENV_WARM_POOL` when it is not a whole number >= 0.
    """
    return requested_pool(env) or 0


class WarmSpawner:
    """A :class:`~tidal.launch.process.Spawner` that starts ``python script.py`` workers
    from a pool of ``size`` interpreters started ahead; see the module docstring."""

    def __init__(
        self,
        size: int,
        *,
        preload: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        fill: bool = True,
        refill: bool = True,
        turns: ImportTurns | None = None,
    ) -> None:
        """Keep ``size`` interpreters (each refilled as it is taken), each importing torch
        and ``preload`` under this environment plus ``env`` (the job's); start them now,
        or with ``fill=False`` at :meth:`fill`. With ``refill=False`` a taken one is not
        replaced until :meth:`keep` is called (a job's start is not slowed by it). With
        ``turns``, its interpreters import in turns (:mod:`tidal.launch.import_turns`)
        until :meth:`end_turns` or :meth:`keep`."""
        if size < 1:
            raise ValueError(f"size: expected at least 1 interpreter, got {size}")
        self.size = size
        self.preload = tuple(preload)
        self._cold = LocalSpawner()
        self._start_env = {**os.environ, **(env or {}), **_START_ENV}
        self._ready: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        self._filled = False
        self._closed = False
        self._refill = refill
        self._turns = turns
        #: Interpreters of the pool whose :data:`READY_LINE` was read (by
        #: :meth:`wait_warm`); a pid leaves once its interpreter is taken or found dead,
        #: since the system may give it to another process, even to a later interpreter.
        self._warm: set[int] = set()
        if fill:
            self.fill()

    def fill(self) -> None:
        """Start the pool's interpreters (once; later calls do nothing)."""
        with self._lock:
            if self._filled or self._closed:
                return
            self._filled = True
            self._ready.extend(self._start_one() for _ in range(self.size))

    def _start_one(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "tidal.launch.warm"),
                *((self._turns.argument(),) if self._turns is not None else ()),
                *self.preload,
            ],
            env=self._start_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",  # bytes that are not UTF-8 must not end the reader
            bufsize=1,
            start_new_session=True,
            umask=user_umask(),  # what it forks runs the user's code
        )

    def _fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        if len(argv) < 2 or argv[0] != sys.executable or not argv[1].endswith(".py"):
            return False
        full = {**os.environ, **env}
        names = {k for k in (*full, *self._start_env) if k.startswith("PYTHON")}
        return all(full.get(k) == self._start_env.get(k) for k in names)

    def _take(self) -> tuple[subprocess.Popen[str], bool] | None:
        """The next interpreter of the pool, and whether its ready line was read."""
        with self._lock:
            if not self._ready or self._closed:
                return None
            process = self._ready.pop(0)
            read_ready = process.pid in self._warm
            self._warm.discard(process.pid)
            if self._refill:
                self._ready.append(self._start_one())
        if process.poll() is None:
            return process, read_ready
        process.wait()  # it died waiting (say, killed): start this worker cold
        return None

    def spawn(
        self,
        *,
        worker_id: str,
        slot: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        on_line: Callable[[str], None],
    ) -> LocalProcess:
        """Hand the worker to a warm interpreter when it fits, else start it cold."""
        command = resolve_python(argv)
        taken = self._take() if self._fits(command, env) else None
        if taken is None:
            return self._cold.spawn(
                worker_id=worker_id, slot=slot, argv=argv, env=env, cwd=cwd, on_line=on_line
            )
        process, read_ready = taken
        order = {
            "argv": command[1:],
            "env": {**os.environ, **env},
            "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
            "slot": slot_number(slot),
        }
        _tell(process, json.dumps(order), last=True)

        assert process.stdout is not None
        if not read_ready:
            on_line = _after_ready_line(on_line)
        reader = start_pump(process.stdout, on_line, worker_id)
        return LocalProcess(process, reader)

    def wait_warm(self, timeout: float) -> int:
        """Wait (up to ``timeout`` seconds in all) until each interpreter of the pool has
        done its imports; how many have. A taken interpreter is not waited for, and a
        worker may take one while this waits: the wait never holds the pool."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending = [p for p in self._ready if p.pid not in self._warm]
        for process in pending:
            self._read_ready_line(process, deadline)
        with self._lock:
            for process in self._ready:
                if process.poll() is not None:
                    self._warm.discard(process.pid)
            return sum(p.pid in self._warm for p in self._ready)

    def _read_ready_line(self, process: subprocess.Popen[str], deadline: float) -> None:
        """Read ``process``'s output up to its :data:`READY_LINE` (by ``deadline``).

        Each read is made under the pool's lock, and only while the interpreter is still
        in the pool: once taken, its output is its worker's and the pump reads on from
        there. Nothing follows the ready line until a worker's order is written, so no
        read here takes a worker's output. The lock is never held across a wait: a take
        must not wait for an interpreter's imports, which may be waiting for a turn.
        """
        assert process.stdout is not None
        fd = process.stdout.fileno()  # raw reads: the text buffer stays the pump's
        partial = b""
        while process in self._ready and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return  # still importing at the deadline
            # In slices: a taken interpreter's pump may read what woke this up.
            if not select.select([fd], [], [], min(left, _READ_SLICE_S))[0]:
                continue
            with self._lock:
                if process not in self._ready or self._closed:
                    return
                chunk = os.read(fd, 65536)
                if not chunk:
                    return  # it died: its take starts the worker cold
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    if text == READY_LINE:
                        self._warm.add(process.pid)
                        return
                    # What its imports printed before any worker was in it.
                    log.debug("warm interpreter pid=%d: %s", process.pid, text)

    def end_turns(self) -> None:
        """From now on the pool's interpreters import without turns; those waiting for
        one go ahead."""
        with self._lock:
            self._end_turns()

    def _end_turns(self) -> None:
        if self._turns is None:
            return
        self._turns = None
        for process in self._ready:
            if process.pid not in self._warm:
                _tell(process, GO_LINE)

    def keep(self, size: int, *, preload: Sequence[str] = ()) -> None:
        """From now on keep ``size`` interpreters (0: close the pool), refilled as they
        are taken: the excess ready ones end, missing ones start, importing ``preload``."""
        if size < 1:
            self.close()
            return
        with self._lock:
            if self._closed:
                return
            self.size, self.preload = size, tuple(preload)
            self._filled = self._refill = True
            excess, self._ready = self._ready[size:], self._ready[:size]
            # The pool is the job's now: what it keeps imports at once, as a job's own
            # pool does, and those still waiting for a turn go ahead.
            self._end_turns()
            self._warm.difference_update(p.pid for p in excess)
            self._ready.extend(self._start_one() for _ in range(size - len(self._ready)))
        for process in excess:
            process.kill()
            process.wait()

    def close(self) -> None:
        """End the interpreters nobody took."""
        with self._lock:
            ready, self._ready = self._ready, []
            self._warm.clear()
            self._closed = True
        for process in ready:
            process.kill()
            process.wait()


def _tell(process: subprocess.Popen[str], line: str, *, last: bool = False) -> None:
    """Write ``line`` to a pool interpreter's stdin (and close it if ``last``)."""
    assert process.stdin is not None
    try:
        process.stdin.write(line + "\n")
        process.stdin.flush()
        if last:
            process.stdin.close()
    except OSError:  # it died just now: the exit shows as the worker's, or its take's
        pass


def _after_ready_line(on_line: Callable[[str], None]) -> Callable[[str], None]:
    """``on_line`` for the output of an interpreter whose :data:`READY_LINE` nobody read
    yet: that line is dropped (once; what its imports printed before it is kept)."""
    seen = False

    def pass_on(line: str) -> None:
        nonlocal seen
        if not seen and line.rstrip("\n") == READY_LINE:
            seen = True
            return
        on_line(line)

    return pass_on


def main() -> None:
    """The pool's interpreter: import torch and the modules named in its arguments (in
    its turn, when its first argument names turns), wait for the worker's order, run its
    script."""
    import importlib

    preload = sys.argv[1:]
    turns = ImportTurns.parse(preload)
    turn = turns.take(sys.stdin) if turns is not None else None

    import torch

    # What a script's first optimizer loads: torch.optim imports torch._dynamo on first
    # use, ~1.5 s here and most of a warm newcomer's own set-up.
    for name in ("torch._dynamo", *preload):
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # CUDA would keep the devices it saw now, not the worker's CUDA_VISIBLE_DEVICES.
        sys.exit(0)
    if turn is not None:
        os.close(turn)  # the next interpreter's turn
    print(READY_LINE, flush=True)

    line = sys.stdin.readline()
    while line.rstrip("\n") == GO_LINE:  # it came while it imported: nothing to do now
        line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the pool closed without using this interpreter
    order = json.loads(line)
    # As a cold start's stdin: nothing to read.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(order["cwd"])
    os.environ.clear()
    os.environ.update(order["env"])
    # The worker's CPUs and memory, as a cold start takes them before its exec.
    apply_here(
        WorkerLimits.from_env(os.environ),
        int(order.get("slot", 0)),
        gpu="CUDA_VISIBLE_DEVICES" in order["env"],
    )
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))  # read at import otherwise, before the order
    elif WorkerLimits.from_env(os.environ).cpus is not None:
        # torch sized its pool for every CPU at import; the worker now has fewer.
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    script = order["argv"][0]
    sys.argv = list(order["argv"])
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
