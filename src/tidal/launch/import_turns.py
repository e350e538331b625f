"""Import turns: a host's spare interpreters import torch a few at a time.

A standby's pool starts all its interpreters at once, and each spends seconds of CPU on
``import torch`` and the job's packages. On a host with few cores that burst lands beside
the jobs already training and beside the next job's start, and a slot handover there took
twice as long (``docs/benchmarks.md``, Slot handover). Taking turns spreads the same work:
an interpreter holds one of ``count`` lock files (``flock``, released by the kernel if it
dies) while it imports, so at most ``count`` import at a time.

Turns are for interpreters nobody waits for yet. One that is handed a worker while it
waits for its turn goes ahead at once: its worker would otherwise wait behind spares. So
do those of a standby's pool once it is handed a job (the pool is the job's then, and a
job's own pool imports without turns): :meth:`~tidal.launch.warm.WarmSpawner.end_turns`
tells them to.
"""

from __future__ import annotations

import fcntl
import os
import select
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = ["ImportTurns"]

#: How often a waiting interpreter tries the locks again. A blocking ``flock`` cannot
#: also watch for a worker's order; a few polls a second cost nothing measurable.
_POLL_S = 0.1

_ARG = "--turns="


@dataclass(frozen=True)
class ImportTurns:
    """``count`` turns, as lock files in ``folder`` (shared by every pool that uses it)."""

    folder: Path
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count: expected at least 1 turn, got {self.count}")

    @classmethod
    def for_host(cls, folder: Path) -> ImportTurns:
        """One turn per two CPUs this process may use (at least one): the rest stay free
        for the jobs that train meanwhile."""
        return cls(folder, max(1, len(os.sched_getaffinity(0)) // 2))

    def argument(self) -> str:
        """How an interpreter is told its turns on its command line (:meth:`parse`)."""
        return f"{_ARG}{self.count}:{self.folder}"

    @classmethod
    def parse(cls, args: list[str]) -> ImportTurns | None:
        """Take the turns argument off the front of ``args``, if it is there."""
        if not args or not args[0].startswith(_ARG):
            return None
        count, _, folder = args.pop(0)[len(_ARG) :].partition(":")
        return cls(Path(folder), int(count))

    def take(self, orders: TextIO) -> int | None:
        """Wait for a turn; the descriptor that holds it (close it to give the turn
        back), or ``None`` once ``orders`` has something to read: a worker was handed
        to this interpreter, or its pool was told to go ahead without turns."""
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            for number in range(self.count):
                fd = os.open(self.folder / f"turn-{number}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                return fd
            if select.select([orders], [], [], _POLL_S)[0]:
                return None
