"""Values derived from a job's row, kept until the row changes.

Every write to a job's row gives it the store's next change number
(:func:`~tidal.controller.store.database.number_change`): a pending request, a goodput report
and the loop's updates all do. So a value made from a job at change N (its record, its
view in the listing) is current for as long as the job's number is still N, and reading
the job's plain columns is enough to know. That is what lets the controller's tick read
every active job, and the API list a page of them, at the rate requests arrive.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["ChangeCache"]

V = TypeVar("V")


class ChangeCache(Generic[V]):
    """The latest ``capacity`` values stored, each under a key and the change number of
    the job it was made from; safe to share between threads (store immutable values)."""

    def __init__(self, capacity: int = 20_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be at least 1 (got {capacity})")
        self.capacity = capacity
        self._values: OrderedDict[Hashable, tuple[int, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, change: int) -> V | None:
        """The value under ``key`` if it was made at ``change``."""
        with self._lock:
            found = self._values.get(key)
            if found is None or found[0] != change:
                return None
            self._values.move_to_end(key)
            return found[1]

    def put(self, key: Hashable, change: int, value: V) -> None:
        """Keep ``value``, made at ``change``, under ``key`` (unless a value made at a later
        change is kept already); the least recently used goes beyond ``capacity``."""
        with self._lock:
            held = self._values.get(key)
            if held is not None and held[0] > change:
                return
            self._values[key] = (change, value)
            self._values.move_to_end(key)
            while len(self._values) > self.capacity:
                self._values.popitem(last=False)
