"""Files tidal's own processes write are their owner's only.

The server and each job's agent write into the data dir (the server's record, launch
files, logs, agents' records and final statuses): they may show commands, environments and
a job's output, so they are made ``0600`` (folders ``0700``) by a umask of ``077`` for those
processes' whole life, whatever creates the file. The processes they start for the user
(an agent, in turn its workers) get the user's own umask back, so a job's own files are
made as the user expects; checkpoints are written private explicitly
(:mod:`tidal.runtime.checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PRIVATE_UMASK", "private_files", "user_umask"]

#: Files rw for the owner only, folders rwx for the owner only.
PRIVATE_UMASK = 0o077

_user: int | None = None


@contextmanager
def private_files() -> Iterator[None]:
    """Within the block, this process creates files ``0600`` and folders ``0700``; the
    umask it had before is the one :func:`user_umask` gives the processes it starts."""
    global _user
    previous = os.umask(PRIVATE_UMASK)
    outer = _user
    if _user is None:
        _user = previous
    try:
        yield
    finally:
        os.umask(previous)
        _user = outer


def user_umask() -> int:
    """The umask for a process started on the user's behalf (``subprocess.Popen``'s
    ``umask``): the user's, or ``-1`` (unchanged) outside :func:`private_files`."""
    return -1 if _user is None else _user
