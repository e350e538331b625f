"""The local backend's standby agent: one job's agent started ahead, pool warm.

:class:`Standby` starts ``python -m tidal.launch.standby`` (see that module) and hands it
the next job a backend starts; the job's agent is then that process, its first workers
the standby's warm interpreters. The next standby is started only while no job starts
(:meth:`Standby.keep` is told so by the backend), so its imports never compete with a
job's start. Its interpreters import ahead the installed packages the scripts of the
latest jobs imported (:meth:`Standby.learn`): a team runs the same scripts again, and a
package such as scikit-learn costs a newcomer seconds more than torch already imported
does. Its stdin is a pipe from the backend: when the server ends or dies, the pipe
closes and a standby that took no job exits with its pool, leaving nothing to find.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidal.launch.agent import ENV_AGENT_TREE
from tidal.launch.file_modes import user_umask
from tidal.launch.process import kill_marked

__all__ = ["PRELOAD_MAX", "Handed", "Standby"]

log = logging.getLogger("tidal.backends.local")

#: The most modules a standby's interpreters import ahead (the newest jobs' first).
PRELOAD_MAX = 16

#: How long a killed standby is waited for (reaped) before its tree is swept.
_KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class Handed:
    """A standby that took a job: now that job's agent."""

    process: subprocess.Popen[bytes]
    #: Its :data:`~tidal.launch.agent.ENV_AGENT_TREE` token (its pool's too).
    tree: str


class Standby:
    """At most one standby agent of ``workers`` warm interpreters (0: none, ever)."""

    def __init__(self, state_dir: Path, workers: int) -> None:
        if workers < 0:
            raise ValueError(f"standby_workers: expected a whole number >= 0, got {workers}")
        self.state_dir = state_dir
        self.workers = workers
        self.process: subprocess.Popen[bytes] | None = None
        self.tree = ""
        #: The job that took the last standby, until it trains (or ends): no new one
        #: starts meanwhile.
        self.taken_by: str | None = None
        #: What the next standby's interpreters import ahead: installed packages the
        #: latest jobs' scripts import at their top level, the newest job's first.
        self.preload: tuple[str, ...] = ()

    def learn(self, imports: Sequence[str]) -> None:
        """Note what the script of a job just started imports (found by
        :mod:`tidal.launch.script_imports`), for the next standby to import ahead."""
        if self.workers == 0:
            return
        self.preload = tuple(dict.fromkeys([*imports, *self.preload]))[:PRELOAD_MAX]

    def keep(self, *, starting: bool) -> None:
        """Replace a standby that died, and start one where none is, unless a job is
        ``starting`` (its start comes first)."""
        if self.workers == 0:
            return
        if self.process is not None and self.process.poll() is not None:
            log.warning("the standby agent exited with status %s", self.process.returncode)
            self._end()
        if self.process is None and not starting:
            self._start()

    def _start(self) -> None:
        self.tree = f"standby-{secrets.token_hex(8)}"
        fd = os.open(self.state_dir / "standby.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "ab") as sink:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tidal.launch.standby"),
                    *(str(self.workers), str(self.state_dir), *self.preload),
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE,
                start_new_session=True,  # once it takes a job, it outlives the controller
                env={**os.environ, ENV_AGENT_TREE: self.tree},
                umask=user_umask(),
            )
        log.info(
            "standby agent pid=%d started (%d warm interpreter(s), importing %s)",
            self.process.pid,
            self.workers,
            ", ".join(("torch", *self.preload)),
        )

    def hand(self, job_id: str, config_path: Path) -> Handed | None:
        """Give the job of ``config_path`` to the standby; ``None`` when there is none
        alive to take it (the job's agent is spawned then)."""
        process = self.process
        if process is None or process.poll() is not None:
            return None
        assert process.stdin is not None
        try:
            process.stdin.write(f"{config_path}\n".encode())
            process.stdin.close()
        except OSError as exc:  # it died just now
            log.warning("job=%s: the standby agent could not take it: %s", job_id, exc)
            self._end()
            return None
        handed = Handed(process, self.tree)
        self.process, self.tree, self.taken_by = None, "", job_id
        log.info("job=%s: handed to the standby agent pid=%d", job_id, process.pid)
        return handed

    def _end(self) -> None:
        """Stop the standby and everything of it, its pool included."""
        process, tree, self.process, self.tree = self.process, self.tree, None, ""
        if process is None:
            return
        # Killed, not asked: its pool's imports may take seconds before it reads stdin.
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=_KILL_WAIT_S)
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        if tree:
            kill_marked(tree, variable=ENV_AGENT_TREE)

    def close(self) -> None:
        """Stop the standby (a job it took lives on as that job's agent)."""
        self._end()
