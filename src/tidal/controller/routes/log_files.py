"""Reading workers' log files: the last lines, and what is appended afterwards."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["LogFollower", "tail_lines"]

_BLOCK = 64 * 1024


def tail_lines(path: Path, n: int) -> list[str]:
    """The last ``n`` lines of a file (reading from its end, so big logs stay cheap)."""
    if n <= 0:
        return []
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            data = b""
            while end > 0 and data.count(b"\n") <= n:
                step = min(_BLOCK, end)
                end -= step
                f.seek(end)
                data = f.read(step) + data
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]


class LogFollower:
    """Yields lines appended to a set of worker logs since the last call.

    Partial lines (no newline yet) are held back until complete, so a line is never split
    across two reads.
    """

    def __init__(self, start_at_end: Mapping[int, Path]) -> None:
        self._offsets: dict[Path, int] = {}
        for path in start_at_end.values():
            try:
                self._offsets[path] = path.stat().st_size
            except OSError:
                self._offsets[path] = 0

    def read(self, paths: Mapping[int, Path]) -> list[tuple[int, str]]:
        """New complete lines as ``(worker id, line)``, worker by worker."""
        out: list[tuple[int, str]] = []
        for worker_id, path in sorted(paths.items()):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk.rfind(b"\n") + 1
            if complete == 0:
                continue
            self._offsets[path] = offset + complete
            for line in chunk[:complete].decode("utf-8", errors="replace").splitlines():
                out.append((worker_id, line))
        return out
