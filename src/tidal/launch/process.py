"""How a :class:`~tidal.launch.groups.elastic.WorkerGroup` starts worker processes.

The group decides *when* a worker starts, is admitted, leaves or is killed; a
:class:`Spawner` decides *where and how* its process runs. :class:`LocalSpawner` runs
workers as subprocesses of this process (``tidal run`` and the local backend's agents);
other backends (Ray) run them elsewhere behind the same small :class:`WorkerProcess`
interface, so the rescale protocol and failure handling are the same code everywhere.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from tidal.launch.file_modes import user_umask
from tidal.launch.limits import (
    WorkerLimits,
    delegated_cgroup,
    out_of_memory,
    preexec,
    remove_cgroup,
    worker_cgroup,
)
from tidal.launch.log_sink import start_pump
from tidal.launch.slot_names import slot_indices

__all__ = [
    "ENV_PROCESS_TREE",
    "LocalProcess",
    "LocalSpawner",
    "Spawner",
    "WorkerProcess",
    "kill_marked",
    "resolve_python",
]

#: Set to a token unique to each local worker; every process the worker starts inherits it,
#: including those that left its session (``setsid``) or were orphaned. That is how
#: :meth:`LocalProcess.kill` finds the whole tree without cgroups.
ENV_PROCESS_TREE = "TIDAL_PROCESS_TREE"


def marked_pids(token: str, *, variable: str = ENV_PROCESS_TREE) -> list[int]:
    """Processes (of this user) whose environment carries ``variable=token``."""
    needle = f"{variable}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or not ours
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(token: str, *, variable: str = ENV_PROCESS_TREE, rounds: int = 5) -> int:
    """SIGKILL every process marked ``variable=token`` (see :data:`ENV_PROCESS_TREE`),
    again while new ones appear (a dying tree may fork); returns how many were signalled."""
    killed = 0
    for _ in range(rounds):
        pids = [p for p in marked_pids(token, variable=variable) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def resolve_python(argv: Sequence[str]) -> list[str]:
    """``python``/``python3`` at the head of a command means this interpreter (the one
    tidal runs in, with torch installed), not whatever ``PATH`` finds first."""
    if argv and Path(argv[0]).name in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


class WorkerProcess(Protocol):
    """One running worker, wherever it runs. Every method returns promptly."""

    @property
    def pid(self) -> int | None:
        """The worker's process id on its host (``None`` while not known yet)."""
        ...

    @property
    def returncode(self) -> int | None:
        """The exit status once known (negative: killed by that signal), else ``None``."""
        ...

    def poll(self) -> int | None:
        """Check for an exit without blocking; returns :attr:`returncode`."""
        ...

    def kill(self) -> None:
        """Kill the worker and everything it started, at once (SIGKILL)."""
        ...

    def terminate(self) -> None:
        """Ask the worker to end (SIGTERM to its session); :meth:`kill` if it does not."""
        ...

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the exit; the status, or ``None`` if still
        running."""
        ...

    def drain(self, timeout: float) -> None:
        """Wait (bounded) until every line the worker printed was delivered."""
        ...


class Spawner(Protocol):
    """Starts worker processes for a group."""

    def spawn(
        self,
        *,
        worker_id: str,
        slot: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        on_line: Callable[[str], None],
    ) -> WorkerProcess:
        """Start ``argv`` for worker ``worker_id`` on ``slot``.

        ``env`` is added to the environment of the place the worker runs (it holds the
        runtime's ``TIDAL_*`` variables); ``on_line`` receives each line of the worker's
        combined stdout and stderr, newline included, from any thread.
        """
        ...


class LocalProcess:
    """A worker subprocess of this process, in its own session."""

    def __init__(
        self,
        process: subprocess.Popen[str],
        reader: threading.Thread,
        token: str = "",
        cgroup: Path | None = None,
    ) -> None:
        """``token``: the worker's :data:`ENV_PROCESS_TREE` value (empty: none);
        ``cgroup``: the cgroup v2 it runs in, holding its limits (``None``: none)."""
        self.process = process
        self._reader = reader
        self.token = token
        self.cgroup = cgroup

    def out_of_memory(self) -> bool:
        """Whether the kernel killed the worker for passing its cgroup's memory limit."""
        return out_of_memory(self.cgroup)

    @property
    def pid(self) -> int:
        """The subprocess's pid (also its process group id)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped."""
        return self.process.returncode

    def poll(self) -> int | None:
        """Reap the subprocess if it exited."""
        code = self.process.poll()
        if code is not None and self.cgroup is not None and not self.out_of_memory():
            remove_cgroup(self.cgroup)  # kept while it still says the worker ran out
        return code

    def kill(self) -> None:
        """SIGKILL the worker's whole tree: its session (data-loader workers) and every
        process that carries its mark, also after the worker itself exited (a grandchild
        that called ``setsid`` outlives it otherwise)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        if self.token:
            kill_marked(self.token)
        if self.process.poll() is not None:
            remove_cgroup(self.cgroup)

    def terminate(self) -> None:
        """SIGTERM the worker's session (it and the processes it started there)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """Wait for the exit, at most ``timeout`` seconds."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        return self.process.returncode

    def drain(self, timeout: float) -> None:
        """Wait for the output reader to reach the end of the pipe."""
        self._reader.join(timeout=timeout)


class LocalSpawner:
    """Workers as subprocesses of this process, each in its own session, so a Ctrl-C
    reaches the launcher, which stops them in order."""

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
        """Start the subprocess and a thread that pumps its output to ``on_line``; it
        takes the limits its environment carries (:mod:`tidal.launch.limits`) first."""
        token = f"{os.getpid()}-{worker_id}-{secrets.token_hex(8)}"
        limits = WorkerLimits.from_env(env)
        cgroup = None
        if not limits.empty:
            root = delegated_cgroup()
            cgroup = worker_cgroup(root, token, limits) if root is not None else None
        process = subprocess.Popen(
            resolve_python(argv),
            cwd=cwd,
            env={**os.environ, **env, ENV_PROCESS_TREE: token},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",  # bytes that are not UTF-8 must not end the reader
            bufsize=1,
            start_new_session=True,
            umask=user_umask(),  # the user's files are made as the user expects
            preexec_fn=preexec(
                limits, slot_number(slot), gpu="CUDA_VISIBLE_DEVICES" in env, cgroup=cgroup
            ),
        )
        assert process.stdout is not None
        reader = start_pump(process.stdout, on_line, worker_id)
        return LocalProcess(process, reader, token, cgroup)


def slot_number(slot: str) -> int:
    """The first index of a slot name (``host:2,3`` → 2; 0 when it has none): which of
    the host's CPUs a worker is pinned to (:func:`~tidal.launch.limits.cpu_choice`)."""
    first = slot_indices(slot)[0]
    return int(first) if first.isdigit() else 0
