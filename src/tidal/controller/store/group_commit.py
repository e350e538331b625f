"""Group commit: writes that arrive together are committed in one transaction.

SQLite commits one transaction at a time, and under load most of a small transaction's
time is the hand-over around it (the write lock, the interpreter's lock between its
statements), not its own work. When many threads add at once, the first to get its turn
commits everything queued by then and the others find their result ready, so a burst of
N submissions costs about one transaction, not N in a row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Entry(Generic[Item, Result]):
    item: Item
    done: bool = False
    result: Result | None = None
    error: BaseException | None = None


class GroupCommit(Generic[Item, Result]):
    """Runs ``commit(items)`` for the items callers :meth:`add`, several at a time.

    ``commit`` writes a batch in one transaction and returns a result per item, in order;
    if it raises, each item of that batch is committed again alone (``commit([item])``),
    so one bad item fails only its own caller.
    """

    def __init__(self, commit: Callable[[Sequence[Item]], Sequence[Result]]) -> None:
        self._commit = commit
        self._queued: list[_Entry[Item, Result]] = []
        self._queue_lock = threading.Lock()
        self._turn = threading.Lock()

    def add(self, item: Item) -> Result:
        """Commit ``item`` (with whatever else is queued) and return its result; raises
        what committing it alone raised."""
        entry: _Entry[Item, Result] = _Entry(item)
        with self._queue_lock:
            self._queued.append(entry)
        with self._turn:
            if not entry.done:
                with self._queue_lock:
                    batch, self._queued = self._queued, []
                self._run(batch)
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]

    def _run(self, batch: list[_Entry[Item, Result]]) -> None:
        try:
            try:
                results = self._commit([e.item for e in batch])
                for entry, result in zip(batch, results, strict=True):
                    entry.result, entry.done = result, True
            except Exception:
                for entry in batch:
                    try:
                        (entry.result,) = self._commit([entry.item])
                    except Exception as exc:
                        entry.error = exc
                    entry.done = True
        finally:
            # Interrupted (KeyboardInterrupt, SystemExit): the rest are not committed, and
            # their callers must hear so rather than wait for a turn that has passed.
            for entry in batch:
                if not entry.done:
                    entry.error = RuntimeError("interrupted before it was committed")
                    entry.done = True
