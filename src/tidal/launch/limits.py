"""A worker's ``resources.cpus`` and ``resources.memory``, honoured on its host.

The limits travel to wherever the worker starts in its environment
(:data:`ENV_CPUS`, :data:`ENV_MEMORY`; the script may read them too). The process that
starts a worker here enforces them as far as the machine allows:

* **cgroup v2**, when a delegated cgroup is writable (:func:`delegated_cgroup`): each
  worker runs in a cgroup of its own under it, with ``memory.max`` (the kernel's OOM
  killer ends a worker past it, and ``memory.events`` says so) and ``cpu.max`` (a
  quota of ``cpus`` CPUs);
* otherwise **CPU affinity and an rlimit**, set in the worker's process before it execs:
  ``sched_setaffinity`` to ``ceil(cpus)`` of the CPUs this process may use (a worker's
  slot picks which, so workers on different slots get different CPUs while there are
  enough), and ``RLIMIT_AS`` of ``memory`` bytes (``RLIMIT_DATA`` on a GPU slot: CUDA
  reserves far more address space than it uses), so an allocation past the limit fails
  (Python: ``MemoryError``).

A worker that ends for its memory is reported as *exceeded its memory limit of 2 GiB*
(:func:`memory_cause`), not as a plain failure.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV_CGROUP_ROOT",
    "ENV_CPUS",
    "ENV_MEMORY",
    "WorkerLimits",
    "cpu_choice",
    "delegated_cgroup",
    "enforcement",
    "format_bytes",
    "memory_cause",
    "out_of_memory",
]

#: CPUs a worker may use (a float, as the spec's ``resources.cpus``).
ENV_CPUS = "TIDAL_WORKER_CPUS"
#: Bytes of memory a worker may use (unset: no limit).
ENV_MEMORY = "TIDAL_WORKER_MEMORY"
#: A cgroup v2 directory delegated to tidal (the workers' cgroups are made under it);
#: unset: the parent of this process's own cgroup, when that one is writable.
ENV_CGROUP_ROOT = "TIDAL_CGROUP_ROOT"

_CGROUP_FS = Path("/sys/fs/cgroup")
#: What a host allocation that failed says, in Python and in the libraries torch uses
#: (not a GPU's ``CUDA out of memory``: the host's limit is not what ran out).
_OUT_OF_MEMORY = re.compile(
    r"^MemoryError\b|can't allocate memory|Cannot allocate memory|std::bad_alloc"
)


@dataclass(frozen=True)
class WorkerLimits:
    """What one worker may use: ``cpus`` CPUs and ``memory`` bytes (``None``: no limit)."""

    cpus: float | None = None
    memory: int | None = None

    def env(self) -> dict[str, str]:
        """The limits as the worker's environment carries them."""
        out: dict[str, str] = {}
        if self.cpus is not None:
            out[ENV_CPUS] = repr(float(self.cpus))
        if self.memory is not None:
            out[ENV_MEMORY] = str(int(self.memory))
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerLimits:
        """The limits a worker's environment carries (malformed values: no limit)."""
        cpus: float | None = None
        memory: int | None = None
        with contextlib.suppress(KeyError, ValueError):
            cpus = float(env[ENV_CPUS])
            if not math.isfinite(cpus) or cpus <= 0:
                cpus = None
        with contextlib.suppress(KeyError, ValueError):
            memory = int(env[ENV_MEMORY])
            if memory <= 0:
                memory = None
        return cls(cpus=cpus, memory=memory)

    @property
    def empty(self) -> bool:
        """Nothing to enforce."""
        return self.cpus is None and self.memory is None


def format_bytes(count: int) -> str:
    """``2147483648`` → ``2 GiB``; ``1536 MiB`` stays so (whole units where exact)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            value = count / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{count} bytes"


def cpu_choice(cpus: float, slot_index: int, available: Sequence[int]) -> tuple[int, ...]:
    """The CPUs a worker of ``cpus`` CPUs on slot ``slot_index`` is pinned to: ``ceil(cpus)``
    consecutive ones of ``available`` (all of them at most), the ``slot_index``-th such
    block, wrapping round when the slots outnumber the blocks."""
    cpu_list = sorted(available)
    if not cpu_list:
        return ()
    width = min(len(cpu_list), max(1, math.ceil(cpus)))
    start = (slot_index * width) % len(cpu_list)
    return tuple(sorted(cpu_list[(start + i) % len(cpu_list)] for i in range(width)))


def delegated_cgroup(env: Mapping[str, str] | None = None) -> Path | None:
    """The cgroup v2 directory workers' cgroups are made under, or ``None`` when there
    is none this process may write (cgroup v1, or a cgroup not delegated to this user).

    :data:`ENV_CGROUP_ROOT` when set, else the parent of this process's own cgroup; it
    must list the ``memory`` controller in ``cgroup.subtree_control`` and be writable.
    """
    env = os.environ if env is None else env
    root: Path | None = None
    if env.get(ENV_CGROUP_ROOT):
        root = Path(env[ENV_CGROUP_ROOT])
    else:
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        if len(lines) != 1 or not lines[0].startswith("0::"):
            return None  # cgroup v1 or a hybrid hierarchy: no unified tree to use
        own = _CGROUP_FS / lines[0][3:].lstrip("/")
        root = own.parent if own != _CGROUP_FS else None
    if root is None:
        return None
    try:
        controllers = (root / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if "memory" not in controllers or not os.access(root, os.W_OK):
        return None
    return root


def enforcement(gpu: bool = False) -> str:
    """How limits are enforced on this host, in words (the agent logs it)."""
    if delegated_cgroup() is not None:
        return "cgroup v2 (memory.max, cpu.max)"
    rlimit = "RLIMIT_DATA" if gpu else "RLIMIT_AS"
    return f"CPU affinity and {rlimit}"


def worker_cgroup(root: Path, token: str, limits: WorkerLimits) -> Path | None:
    """Make the cgroup of one worker under ``root`` with ``limits``; ``None`` if the
    kernel refused (the worker then runs under the rlimit instead)."""
    path = root / f"tidal-{token}"
    try:
        path.mkdir()
        controllers = (root / "cgroup.subtree_control").read_text().split()
        if limits.memory is not None:
            (path / "memory.max").write_text(str(limits.memory))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to turn off
                (path / "memory.swap.max").write_text("0")
        if limits.cpus is not None and "cpu" in controllers:
            period = 100_000
            (path / "cpu.max").write_text(f"{int(limits.cpus * period)} {period}")
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def out_of_memory(cgroup: Path | None) -> bool:
    """Whether the kernel's OOM killer ended a process of ``cgroup`` (a worker's)."""
    if cgroup is None:
        return False
    try:
        for line in (cgroup / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
    except (OSError, ValueError):
        return False
    return False


def remove_cgroup(cgroup: Path | None) -> None:
    """Remove a worker's cgroup once its processes are gone (it may still be busy)."""
    if cgroup is not None:
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def preexec(
    limits: WorkerLimits, slot_index: int, *, gpu: bool, cgroup: Path | None
) -> Callable[[], None] | None:
    """What the worker's process runs between fork and exec to take its limits
    (``None``: nothing to do). Only system calls, with every argument worked out here:
    the parent has threads, and the child may run nothing that takes a lock."""
    if limits.empty:
        return None
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None
    cpus: tuple[int, ...] = ()
    if procs is None and limits.cpus is not None:
        cpus = cpu_choice(limits.cpus, slot_index, sorted(os.sched_getaffinity(0)))
    which = resource.RLIMIT_DATA if gpu else resource.RLIMIT_AS
    memory = limits.memory if procs is None else None

    def apply() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if memory is not None:
            resource.setrlimit(which, (memory, memory))

    return apply


def apply_here(limits: WorkerLimits, slot_index: int, *, gpu: bool) -> None:
    """Take ``limits`` in this process (a warm interpreter about to run its worker's
    script): the affinity and rlimit of :func:`preexec`."""
    hook = preexec(limits, slot_index, gpu=gpu, cgroup=None)
    if hook is not None:
        hook()


def memory_cause(limit: int | None, exception: str | None, oom_killed: bool) -> str | None:
    """Why a worker with a memory ``limit`` failed, when it was for memory: the kernel
    killed it in its cgroup, or its last exception (``exception``) is a failed
    allocation; else ``None``."""
    if limit is None:
        return None
    if oom_killed or (exception is not None and _OUT_OF_MEMORY.search(exception)):
        return f"exceeded its memory limit of {format_bytes(limit)}"
    return None
