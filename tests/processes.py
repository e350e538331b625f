"""Whether a process still runs, as the tests that watch processes end need it."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Whether ``pid`` still runs. A zombie (exited, not yet reaped by its parent) counts
    as ended, and so does a process that vanishes while its ``/proc`` entry is read:
    reading ``/proc/PID/stat`` of a process reaped mid-read raises ``ProcessLookupError``,
    not ``FileNotFoundError``, so every ``OSError`` means it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()
    except OSError:
        return False
    return bool(state) and state[0] not in ("Z", "X")
