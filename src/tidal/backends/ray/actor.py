"""The body of a worker's Ray actor: the user's command as a subprocess on the actor's node.

:class:`WorkerActor` is what Ray runs on the node a slot names: it starts the command with
the runtime's ``TIDAL_*`` variables (killed by the kernel if the actor's process dies),
buffers its output and reports its exit status. The controller's handle on it is
:class:`~tidal.backends.ray.worker.RayProcess`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from tidal.launch.process import resolve_python

__all__ = ["EXIT_CANNOT_RUN", "WorkerActor"]

#: Exit status of a command that could not be started (as a shell reports it).
EXIT_CANNOT_RUN = 127

# The command is started through this tiny prelude: it asks the kernel to SIGKILL it when
# the actor process dies, then becomes the command (same pid). A node that dies or an
# actor that is killed then never leaves a worker training on, talking to its peers.
# (subprocess's preexec_fn would do the same but is unsafe in a process with threads, as
# every Ray worker is.)
_PRELUDE = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "except (OSError, AttributeError):\n"
    "    pass  # not Linux: the actor's own kill still ends the worker\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(137)  # the actor died before the prctl\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class WorkerActor:
    """Runs one worker's command on the node it was placed on (the Ray actor's body).

    Methods are short and the actor runs them one at a time; a reader thread moves the
    command's output into a buffer that :meth:`poll` hands over.
    """

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._code: int | None = None

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> int | None:
        """Start the command; its pid, or ``None`` when it cannot run (the reason is in
        the output, the status :data:`EXIT_CANNOT_RUN`)."""
        command = resolve_python(argv)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _PRELUDE, str(os.getpid()), *command],
                cwd=cwd,
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                start_new_session=True,  # one killpg reaches whatever the command started
            )
        except OSError as exc:
            self._code = EXIT_CANNOT_RUN
            self._lines.append(f"tidal: cannot start {command[:1]} in {cwd}: {exc}\n")
            return None
        self._reader = threading.Thread(target=self._pump, name="tidal-output", daemon=True)
        self._reader.start()
        return self._process.pid

    def _pump(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            with self._lock:
                self._lines.append(line)

    def poll(self) -> tuple[int | None, str]:
        """The exit status (``None`` while running) and the output since the last call;
        once the status is given, the output is complete."""
        if self._process is not None and self._code is None:
            code = self._process.poll()
            if code is not None:
                if self._reader is not None:
                    self._reader.join(timeout=5)
                self._code = code
        with self._lock:
            text, self._lines = "".join(self._lines), []
        return self._code, text

    def terminate(self) -> None:
        """SIGTERM the command's session (it ends in its own time; see :meth:`kill`)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)

    def kill(self) -> tuple[int | None, str]:
        """SIGKILL the command's session and wait for it; then as :meth:`poll`."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10)
        return self.poll()
