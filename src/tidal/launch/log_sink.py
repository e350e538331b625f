"""Workers' output to their log files, in a way that can never stall a worker.

A worker writes to a pipe; a reader thread (:func:`pump_lines`) drains it line by line,
cutting a line longer than :data:`MAX_LINE_CHARS` into pieces, so neither a line without
a newline nor a flood of output grows the reader's memory. Each piece goes to a
:class:`RotatingLog`, which caps the file (``max_bytes``, then ``worker-K.log.1`` …
``.<backups>``) and never raises: when writing fails (a full disk, a removed folder) it
drops lines and counts them, warns once, and tries again a second later, so the pipe keeps
being drained and logging resumes by itself once the disk has room again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = [
    "DEFAULT_LOG_BACKUPS",
    "DEFAULT_LOG_MAX_BYTES",
    "MAX_LINE_CHARS",
    "RotatingLog",
    "pump_lines",
    "start_pump",
]

log = logging.getLogger(__name__)

#: A worker's output line longer than this is written as several lines of this length
#: (a progress bar without newlines, one huge print) so no reader holds more than this.
MAX_LINE_CHARS = 64 * 1024
#: A worker's log is rotated once it would grow past this many bytes …
DEFAULT_LOG_MAX_BYTES = 64 << 20
#: … keeping this many earlier files (``worker-K.log.1`` the newest).
DEFAULT_LOG_BACKUPS = 3
#: After a failed write, lines are dropped without trying for this long.
_RETRY_S = 1.0


def pump_lines(stream: IO[str], on_line: Callable[[str], None], name: str) -> None:
    """Read ``stream`` to its end, handing each line (cut at :data:`MAX_LINE_CHARS`) to
    ``on_line``; whatever ``on_line`` raises is logged once and the stream still drained,
    because a pipe nobody reads blocks the worker writing to it."""
    failures = 0
    for piece in iter(lambda: stream.readline(MAX_LINE_CHARS), ""):
        try:
            on_line(piece if piece.endswith("\n") else piece + "\n")
        except Exception:
            failures += 1
            if failures == 1:
                log.exception("%s: handling a line of output failed; still reading", name)
    if failures > 1:
        log.warning("%s: %d lines of output could not be handled", name, failures)


def start_pump(stream: IO[str], on_line: Callable[[str], None], name: str) -> threading.Thread:
    """A daemon thread running :func:`pump_lines` over ``stream`` (a worker's output
    pipe), started; ``name`` is the worker's, for the thread and the messages."""
    reader = threading.Thread(
        target=pump_lines, args=(stream, on_line, name), name=f"tidal-log-{name}", daemon=True
    )
    reader.start()
    return reader


class RotatingLog:
    """Appends lines to ``path``, capped at ``max_bytes`` and rotated into ``backups``
    earlier files; a failed write drops the line (counted in :attr:`dropped`) instead of
    raising. Written by one reader thread; :meth:`close` may come from another."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = DEFAULT_LOG_MAX_BYTES,
        backups: int = DEFAULT_LOG_BACKUPS,
    ) -> None:
        """``max_bytes`` 0: never rotated. ``backups`` 0: a full file starts over empty."""
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        #: Lines dropped because writing failed, since the log was opened.
        self.dropped = 0
        self._dropped_since_ok = 0
        self._fd: int | None = None
        self._size = 0
        self._retry_at = 0.0
        #: The file ends in the middle of a line (a write stopped part way).
        self._cut = False
        self._closed = False
        self._lock = threading.Lock()
        self._attempt(self._open)

    def write(self, line: str) -> None:
        """Append ``line`` (its newline included); drop it if the file cannot take it."""
        data = line.encode("utf-8", errors="replace")
        with self._lock:
            if self._closed:
                return
            if self._fd is None and time.monotonic() < self._retry_at:
                self._drop()
                return
            if not self._attempt(lambda: self._append(data)):
                self._drop()

    def close(self) -> None:
        """Close the file; later writes are ignored."""
        with self._lock:
            self._closed = True
            self._close_fd()

    # -- inside -----------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            self._open()
        if self.max_bytes and self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        if self._dropped_since_ok:
            lost = self._dropped_since_ok
            # A line the disk took only part of is ended first: the notice is a line.
            lead = "\n" if self._cut else ""
            notice = f"{lead}[tidal: {lost} lines dropped: the log was not writable]\n"
            self._write_all(notice.encode())
            self._cut = False
            log.warning(
                "%s: writing resumed after %d lines were dropped",
                self.path,
                self._dropped_since_ok,
            )
            self._dropped_since_ok = 0
        self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except OSError:
                self._cut = self._cut or len(view) < len(data)
                raise
            self._size += written
            view = view[written:]

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only, like the data dir: a worker's output may show its secrets.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        """``log`` → ``log.1`` → … → ``log.<backups>`` (the oldest goes), then a new
        ``log``. Readers holding the old file keep reading it to its end."""
        self._close_fd()
        if self.backups <= 0:
            os.truncate(self.path, 0)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._open()

    def _attempt(self, action: Callable[[], None]) -> bool:
        try:
            action()
        except OSError as exc:
            self._close_fd()  # reopened on the next try: the folder may be gone too
            self._retry_at = time.monotonic() + _RETRY_S
            if not self._dropped_since_ok:
                log.warning("%s: cannot write (%s); dropping lines until it can", self.path, exc)
            return False
        return True

    def _drop(self) -> None:
        self.dropped += 1
        self._dropped_since_ok += 1

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)
