"""Why a worker failed, in one line: the exception that ended it, read from the end of
its log (the log has the whole traceback), or the words of a program that could not start
its work, or that it exceeded its memory limit. A job's failure carries it to the user.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tidal.launch.limits import memory_cause
from tidal.launch.process import LocalProcess, WorkerProcess

__all__ = ["failure_cause", "last_error_line", "last_exception"]

#: Bytes at the end of a failed worker's log searched for the exception that ended it.
_TAIL_BYTES = 32768
#: The exception line is cut to this many characters.
_CAUSE_CHARS = 300
_TRACEBACK = "Traceback (most recent call last):"
#: ``ValueError: ...``, ``torch.OutOfMemoryError``, ``KeyboardInterrupt``: a dotted name.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: |$)")


def last_exception(text: str) -> str | None:
    """The exception line of the last Python traceback in ``text`` (``ValueError: lr must
    be positive``), or ``None`` when there is no complete one."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if not line or line[0].isspace():
            continue  # the frames and their source lines are indented
        if _EXCEPTION_LINE.match(line):
            return line if len(line) <= _CAUSE_CHARS else line[: _CAUSE_CHARS - 1] + "…"
        return None
    return None


#: The last words of a program that could not start its work, without a traceback:
#: ``python: can't open file '/job/t.py': [Errno 2] No such file or directory``, a shell's
#: ``sh: 1: trian.sh: not found``.
_START_ERROR = re.compile(
    r"can't open file|\[Errno \d+\]|No such file or directory|command not found|: not found$"
)


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` when it says a file or program was not found (a worker
    that never got to a traceback), else ``None``: no other line is taken for a cause."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not _START_ERROR.search(lines[-1]):
        return None
    line = lines[-1].strip()
    return line if len(line) <= _CAUSE_CHARS else line[: _CAUSE_CHARS - 1] + "…"


def failure_cause(
    process: WorkerProcess, log_path: Path | None, memory: int | None = None
) -> str | None:
    """The exception that ended a worker's ``process``, read from the end of its log at
    ``log_path``, so a job's failure says why (the log has the whole traceback); else its
    last line when that says a file or program was not found (:func:`last_error_line`). A
    worker with a ``memory`` limit that ended for want of memory (a failed allocation, or
    the kernel's OOM killer in its cgroup) *exceeded its memory limit of 2 GiB*."""
    oom_killed = isinstance(process, LocalProcess) and process.out_of_memory()
    if log_path is None:
        return memory_cause(memory, None, oom_killed)
    process.drain(timeout=1.0)  # its last lines may still be in the pipe
    try:
        with log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return memory_cause(memory, None, oom_killed)
    exception = last_exception(tail)
    return memory_cause(memory, exception, oom_killed) or exception or last_error_line(tail)
