"""AdaptDL's ``Accumulator`` over tidal's runtime, and where an AdaptDL loop stands.

An accumulator sums what every worker adds (``acc["loss"] += x``) and, in
``with acc.synchronized():``, reads like a dict holding the job-wide sums, the same on every
worker. Its sums survive a rescale: at a planned membership change every member of the
ending generation folds its pending additions into the sums (a collective over the group
still working, :attr:`tidal.State.before_switch`) before any worker leaves, and newcomers
receive the sums with the job's state. They also go into checkpoints. Each accumulator is
known by the epoch it was made in and its number among that epoch's accumulators (as
AdaptDL names them), so the one a newcomer or a restarted worker makes adopts its peers'
sums.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import torch.distributed as dist

from tidal.runtime.context import current

log = logging.getLogger("tidal.compat.adaptdl")

Key = tuple[int | None, int]


class LoopPosition:
    """Where this process's AdaptDL loop stands: the epoch being run (``None`` outside
    ``remaining_epochs_until``) and the loader being iterated (``None`` between loops)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.loader: Any = None


#: This process's loop (one AdaptDL job per process, as in AdaptDL).
position = LoopPosition()


def _add(into: dict[str, Any], updates: Mapping[str, Any], sign: int = 1) -> None:
    for key, value in updates.items():
        into[key] = into[key] + sign * value if key in into else sign * value


class AccumulatorBook:
    """Every accumulator of the process by :data:`Key`, kept with the job's state (a
    ``state_dict``/``load_state_dict`` object of :class:`tidal.State`)."""

    def __init__(self) -> None:
        self.live: dict[Key, Accumulator] = {}
        self._made: dict[int | None, int] = {}
        #: Sums received for accumulators this process has not made yet.
        self._adopt: dict[Key, dict[str, Any]] = {}

    def register(self, accumulator: Accumulator) -> Key:
        """Name a new accumulator and give it the sums its peers hold, if any."""
        epoch = position.epoch
        count = self._made.get(epoch, 0)
        self._made[epoch] = count + 1
        key = (epoch, count)
        self.live[key] = accumulator
        if key in self._adopt:
            accumulator.results.update(self._adopt.pop(key))
        return key

    def end_epoch(self, epoch: int) -> None:
        """Forget the accumulators made in ``epoch`` (an epoch never runs again)."""
        for key in [k for k in self.live if k[0] == epoch]:
            del self.live[key]
        self._adopt = {k: v for k, v in self._adopt.items() if k[0] != epoch}

    def fold_all(self) -> None:
        """Fold every live accumulator's pending additions into its sums (a collective:
        every member calls it at the same point, with the same accumulators)."""
        for key in sorted(self.live, key=lambda k: (k[0] is not None, k[0] or 0, k[1])):
            self.live[key].fold()

    def state_dict(self) -> dict[str, Any]:
        """The sums of every accumulator (pending additions are not state)."""
        return {"sums": {key: dict(acc.results) for key, acc in self.live.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the sums in ``state``; an accumulator made later adopts its own."""
        sums: dict[Key, dict[str, Any]] = state["sums"]
        for key, results in sums.items():
            if key in self.live:
                self.live[key].results = dict(results)
            else:
                self._adopt[key] = dict(results)


#: This process's accumulators.
book = AccumulatorBook()


class _Value:
    """What ``acc[key]`` is while accumulating: it takes ``+= x`` / ``-= x`` so that
    ``acc[key] += x`` adds ``x`` to this worker's pending sum."""

    __slots__ = ("accumulator", "key", "update")

    def __init__(self, accumulator: Accumulator, key: str) -> None:
        self.accumulator = accumulator
        self.key = key
        self.update: Any = 0

    def __add__(self, value: Any) -> _Value:
        if isinstance(value, _Value):
            raise TypeError(f"invalid update type: {type(value).__name__}")
        self.update = self.update + value
        return self

    def __sub__(self, value: Any) -> _Value:
        if isinstance(value, _Value):
            raise TypeError(f"invalid update type: {type(value).__name__}")
        self.update = self.update - value
        return self


class Accumulator(MutableMapping[str, Any]):
    """AdaptDL's ``Accumulator``: sums across every worker of the job, across rescales
    and restarts.

    *Accumulation mode* (the default): ``acc["k"] += v``, ``acc.update(k=v)``,
    ``acc -= {"k": v}`` add to this worker's pending sums; reading gives an empty dict.
    *Synchronized mode* (``with acc.synchronized():``, a collective: every worker enters
    it at the same point): the pending sums of all workers are added up and the
    accumulator reads and writes like a dict, the same on every worker.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if position.loader is not None:
            raise RuntimeError("accumulator may not be initialized during dataloader iteration")
        self.results: dict[str, Any] = dict(*args, **kwargs)
        self._pending: dict[str, Any] = {}
        self._synchronized: dict[str, Any] | None = None
        self.key = book.register(self)

    def fold(self) -> None:
        """Add every worker's pending sums into :attr:`results` (a collective)."""
        context = current()
        gathered: list[Any] = [self._pending]
        if context.group is not None and context.world_size > 1:
            gathered = [None] * context.world_size
            dist.all_gather_object(gathered, self._pending, group=context.group)
        for updates in gathered:
            _add(self.results, updates)
        self._pending = {}

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[Accumulator]:
        """Read and write the job-wide sums, the same on every worker (a collective)."""
        if self._synchronized is not None:
            yield self
            return
        self.fold()
        self._synchronized = self.results
        try:
            yield self
        finally:
            self._synchronized = None

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add each value to its key (``dict.update``'s arguments), not replace it."""
        for key, value in dict(*args, **kwargs).items():
            self[key] += value

    def subtract(self, *args: Any, **kwargs: Any) -> None:
        """Subtract each value from its key."""
        for key, value in dict(*args, **kwargs).items():
            self[key] -= value

    def __iadd__(self, other: Any) -> Accumulator:
        self.update(other)
        return self

    def __isub__(self, other: Any) -> Accumulator:
        self.subtract(other)
        return self

    def __getitem__(self, key: str) -> Any:
        if self._synchronized is not None:
            return self._synchronized[key]
        return _Value(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if self._synchronized is not None:
            self._synchronized[key] = value
            return
        if not isinstance(value, _Value) or value.accumulator is not self or value.key != key:
            raise TypeError(
                f"accumulator[{key!r}]: only += and -= outside `with acc.synchronized():` "
                f"(got {type(value).__name__})"
            )
        _add(self._pending, {key: value.update})

    def __contains__(self, key: object) -> bool:
        return self._synchronized is not None and key in self._synchronized

    def __delitem__(self, key: str) -> None:
        if self._synchronized is None:
            raise KeyError(key)
        del self._synchronized[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._synchronized if self._synchronized is not None else {})

    def __len__(self) -> int:
        return len(self._synchronized) if self._synchronized is not None else 0

    def __repr__(self) -> str:
        return repr(self._synchronized if self._synchronized is not None else {})
