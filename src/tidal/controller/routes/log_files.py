"""Reading workers' log files: the last lines, and what is appended afterwards.

Both are bounded whatever the file holds (a 1 GB line, no newline at all): :func:`tail_lines`
reads backwards from the end in blocks and stops at :data:`TAIL_MAX_BYTES`;
:class:`LogFollower` reads only what was appended since its last call, at most
:data:`FOLLOW_MAX_BYTES` a call, and keeps no more than :data:`MAX_LINE_BYTES` of an
unfinished line. A line longer than :data:`MAX_LINE_BYTES` comes back cut, marked
:data:`CUT_MARK`. Both are blocking file reads: callers run them off the event loop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "CUT_MARK",
    "FOLLOW_MAX_BYTES",
    "MAX_LINE_BYTES",
    "TAIL_MAX_BYTES",
    "LogFollower",
    "tail_lines",
]

#: A line longer than this is returned cut to it (the writer already splits lines at
#: 64 Ki characters; this holds for any file, whoever wrote it).
MAX_LINE_BYTES = 256 * 1024
#: At most this much of a file's end is read for a tail, whatever ``n`` is.
TAIL_MAX_BYTES = 1 << 20
#: At most this much of what was appended is read per file per follow step.
FOLLOW_MAX_BYTES = 1 << 20
#: Marks where a line was cut: at its end when its rest was left out, at its start when
#: its beginning lies before what was read.
CUT_MARK = "[…cut]"

_BLOCK = 64 * 1024


def _cut(line: bytes) -> str:
    if len(line) <= MAX_LINE_BYTES:
        return line.decode("utf-8", errors="replace")
    return line[:MAX_LINE_BYTES].decode("utf-8", errors="replace") + CUT_MARK


def tail_lines(path: Path, n: int, *, max_bytes: int = TAIL_MAX_BYTES) -> list[str]:
    """The last ``n`` lines of a file, from at most its last ``max_bytes`` bytes, each cut
    at :data:`MAX_LINE_BYTES` (a missing or unreadable file has none)."""
    if n <= 0:
        return []
    try:
        with path.open("rb") as f:
            end = f.seek(0, os.SEEK_END)
            blocks: list[bytes] = []
            start, newlines = end, 0
            while start > 0 and end - start < max_bytes and newlines <= n:
                step = min(_BLOCK, start, max_bytes - (end - start))
                start -= step
                f.seek(start)
                block = f.read(step)
                blocks.append(block)
                newlines += block.count(b"\n")
    except OSError:
        return []
    data = b"".join(reversed(blocks))
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the text after the last newline, when the file ends with one
    if not lines:
        return []
    # The first line read may have begun before ``start``: drop it when enough complete
    # lines follow, else show what was read of it, marked as cut at its start.
    head_cut = start > 0
    if head_cut and len(lines) > n:
        lines.pop(0)
        head_cut = False
    out = [_cut(line) for line in lines[-n:]]
    if head_cut and len(lines) <= n:
        first = lines[0][-MAX_LINE_BYTES:]
        out[0] = CUT_MARK + first.decode("utf-8", errors="replace")
    return out


class _Followed:
    """One log being followed: the open file (kept, so a rotation does not lose its end)
    and the unfinished line read from it so far."""

    def __init__(self, path: Path, *, at_end: bool) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        self.partial = b""
        self.skipping = False  # the rest of a line already returned cut
        self._open(at_end=at_end)

    def _open(self, *, at_end: bool) -> None:
        try:
            self.file = self.path.open("rb")
        except OSError:
            self.file = None
            return
        if at_end:
            self.file.seek(0, os.SEEK_END)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def rotated(self) -> bool:
        """Whether ``path`` is now another file than the one open (or was truncated)."""
        assert self.file is not None
        try:
            now = self.path.stat()
        except OSError:
            return False  # between the rename and the new file: read on the old one
        held = os.fstat(self.file.fileno())
        return (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev) or now.st_size < (
            self.file.tell()
        )

    def read(self, limit: int) -> list[str]:
        """Complete lines appended since the last call (at most ``limit`` bytes read);
        after a rotation, the old file's last lines and then the new file's."""
        if self.file is None:
            self._open(at_end=False)
            if self.file is None:
                return []
        chunk = self.file.read(limit)
        lines = self._lines(chunk)
        if len(chunk) < limit and self.rotated():
            self.close()
            self._open(at_end=False)
            if self.file is not None:
                lines += self._lines(self.file.read(limit - len(chunk)))
        return lines

    def _lines(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        parts = (self.partial + chunk).split(b"\n")
        self.partial = parts.pop()
        for part in parts:
            if self.skipping:
                self.skipping = False  # this was the end of a line returned cut
                continue
            out.append(_cut(part))
        if len(self.partial) > MAX_LINE_BYTES:
            if not self.skipping:
                out.append(_cut(self.partial))
            self.skipping = True
            self.partial = b""
        return out


class LogFollower:
    """Yields lines appended to a set of worker logs since the last call.

    Each file is read from where the last call stopped, never again from its start, so a
    growing log costs only its new bytes. Partial lines (no newline yet) are held back
    until complete, up to :data:`MAX_LINE_BYTES` (then returned cut, the rest of that line
    skipped). When the writer rotates a log (``worker-K.log`` renamed to ``.1``), the open
    file is read to its end and the new ``worker-K.log`` followed from its start. Call
    :meth:`close` when done.
    """

    def __init__(self, start_at_end: Mapping[int, Path]) -> None:
        self._files: dict[Path, _Followed] = {
            path: _Followed(path, at_end=True) for path in start_at_end.values()
        }

    def read(self, paths: Mapping[int, Path]) -> list[tuple[int, str]]:
        """New complete lines as ``(worker id, line)``, worker by worker; a log first seen
        here is read from its start."""
        out: list[tuple[int, str]] = []
        for worker_id, path in sorted(paths.items()):
            followed = self._files.get(path)
            if followed is None:
                followed = self._files[path] = _Followed(path, at_end=False)
            try:
                lines = followed.read(FOLLOW_MAX_BYTES)
            except OSError:
                continue
            out.extend((worker_id, line) for line in lines)
        return out

    def close(self) -> None:
        """Close every file held open."""
        for followed in self._files.values():
            with contextlib.suppress(OSError):
                followed.close()
        self._files.clear()
