"""Batches fetched ahead by worker processes, for the steps the loader is about to take.

The workers are those of :class:`torch.utils.data.DataLoader` (worker processes, prefetch
depth, pinned memory, persistent workers, worker seeds, a worker's exception raised in the
training process). What torch cannot know is that the steps ahead depend on things that
change while batches are in flight: the world size, the global batch size, the position
(a rollback or a rewind). So the DataLoader's batch sampler yields the index lists of a
*plan*, the steps this rank will take if nothing changes, and records each planned step in
the order it handed it out; the DataLoader returns results in that same order.

At consumption the loader names the step it takes now. When the oldest planned step is
that one, its batch is returned. When it is another (the plan went stale), everything
prefetched is dropped, unread, and the sampler is re-planned from the step named: a batch
planned for an old world or batch size is never trained, and no step is skipped, because
the loader's position only moves for the batch it consumes.

Each index list carries the number of the plan it belongs to, and the workers read the
current plan's number from shared memory before each sample: a step of a stale plan still
in a worker's queue is answered at once, unread, and one being read stops at its next
sample. Persistent workers are only reused once every one of them has answered what was
queued before (torch's ``_reset``), so without this a re-plan waited for up to
``num_workers * prefetch_factor`` batches to be decoded, each for nothing.
"""

from __future__ import annotations

import atexit
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

#: One planned step: what identifies it (compared at consumption) and this rank's indices.
Planned = tuple[Hashable, list[int]]


class Unwanted(Exception):
    """Raised by :func:`fetch_samples` when its batch stopped being wanted mid-read."""


def fetch_samples(
    dataset: Any,
    indices: torch.Tensor | list[int],
    collate_fn: Callable[[list[Any]], Any],
    wanted: Callable[[], bool] | None = None,
) -> Any:
    """This rank's batch: a :class:`TensorDataset` is cut by indexing its tensors, any other
    dataset is read sample by sample and collated. The same function runs in the training
    process (no workers) and in a worker, so both give the same batches. ``wanted`` is
    asked before each sample is read; once it says no, :class:`Unwanted` is raised."""
    if isinstance(dataset, TensorDataset):
        if not isinstance(indices, torch.Tensor):
            return tuple(t[indices] for t in dataset.tensors)
        # index_select: one kernel, without the Python indexing machinery of t[indices].
        return tuple(torch.index_select(t, 0, _index_for(t, indices)) for t in dataset.tensors)
    if isinstance(indices, torch.Tensor):
        indices = indices.tolist()
    if wanted is None:
        return collate_fn([dataset[i] for i in indices])
    samples = []
    for i in indices:
        if not wanted():
            raise Unwanted
        samples.append(dataset[i])
    return collate_fn(samples)


def _index_for(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``indices`` where ``tensor`` is: a tensor kept on the GPU indexed with a CPU index
    would copy it there synchronously (a host sync every step); an asynchronous copy of
    the few indices does not stall the step (the loader hands them over there already)."""
    if indices.device == tensor.device:
        return indices
    return indices.to(tensor.device, non_blocking=True)


@dataclass(frozen=True)
class PrefetchOptions:
    """How batches are fetched ahead; the names and meanings of
    :class:`torch.utils.data.DataLoader`'s."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    multiprocessing_context: Any = None

    def check(self) -> None:
        """Refuse what :class:`~torch.utils.data.DataLoader` would, naming the argument."""
        if self.num_workers < 0:
            raise ValueError(f"num_workers: expected an integer >= 0, got {self.num_workers!r}")
        if self.num_workers == 0:
            for name in ("prefetch_factor", "multiprocessing_context", "worker_init_fn"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only meaningful with num_workers > 0")
            if self.persistent_workers:
                raise ValueError("persistent_workers: only meaningful with num_workers > 0")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ValueError(
                f"prefetch_factor: expected an integer >= 1 or None, got {self.prefetch_factor!r}"
            )


class _Batches(Dataset[Any]):
    """The user's dataset as the workers see it: a whole index list fetched at once
    (``__getitems__``), by :func:`fetch_samples`. The list's first item is the number of
    the plan it was handed out in; a step of a plan that is no longer :attr:`plan` (in
    shared memory, so the workers see the training process's changes) is not read."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.plan = torch.zeros((), dtype=torch.int64)
        self.plan.share_memory_()  # type: ignore[no-untyped-call]

    def __getitems__(self, tagged: list[int]) -> Any:
        number = tagged[0]
        try:
            # Asked per sample too: a decode-bound batch begun before the re-plan stops
            # at its next sample instead of holding the re-plan for a whole batch.
            return fetch_samples(
                self.dataset, tagged[1:], self.collate_fn, lambda: int(self.plan) == number
            )
        except Unwanted:
            return None  # dropped unread by the training process (see the module doc)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([int(self.plan), index])

    def __len__(self) -> int:
        return len(self.dataset)


def _as_is(batch: Any) -> Any:
    """The DataLoader's collate: the batch was collated by :func:`fetch_samples` already."""
    return batch


class _PlannedSteps(Sampler[list[int]]):
    """The DataLoader's batch sampler: the index lists of the current plan, each step
    recorded in :attr:`handed_out` as the DataLoader takes it (in the training process)."""

    def __init__(self, number: torch.Tensor) -> None:
        self.plan: Iterator[Planned] = iter(())
        self.handed_out: deque[Planned] = deque()
        self.number = number

    def restart(self, plan: Iterator[Planned]) -> None:
        """Hand out ``plan`` from the next ``iter()`` on; forget what the last one did,
        and tell the workers that its steps still queued are not wanted."""
        self.plan = plan
        self.handed_out = deque()
        self.number += 1

    def __iter__(self) -> Iterator[list[int]]:
        return _hand_out(self.plan, self.handed_out, int(self.number))


def _hand_out(plan: Iterator[Planned], record: deque[Planned], number: int) -> Iterator[list[int]]:
    for step in plan:
        record.append(step)
        yield [number, *step[1]]


class Prefetcher:
    """Worker processes that fetch the planned steps ahead (see the module's docstring)."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any],
        options: PrefetchOptions,
        *,
        pin_memory: bool,
        seed: int,
    ) -> None:
        self._dataset = _Batches(dataset, collate_fn)
        self._options = options
        self._pin_memory = pin_memory
        self._seed = seed
        self._steps = _PlannedSteps(self._dataset.plan)
        self._loader: DataLoader[Any] | None = None
        self._iterator: Iterator[Any] | None = None
        #: How many times the batches in flight were dropped and the plan made again (a
        #: diagnostic).
        self.replans = 0
        _live.add(self)

    @property
    def in_flight(self) -> int:
        """Planned steps handed to the workers and not taken yet (a diagnostic)."""
        return len(self._steps.handed_out)

    def take(self, step: Hashable, plan: Callable[[], Iterator[Planned]]) -> tuple[Any, list[int]]:
        """The batch of ``step`` and its indices. ``plan()`` gives the steps from ``step``
        on; it is called when the steps in flight are not those (the first call, or a
        world, batch size or position that changed since they were planned)."""
        head = self._steps.handed_out[0] if self._steps.handed_out else None
        if self._iterator is None or head is None or head[0] != step:
            self._start(plan())
        assert self._iterator is not None
        try:
            batch = next(self._iterator)
        except BaseException:
            # A worker's exception, or a worker that died: start afresh at the next take
            # (the loader's position did not move, so the step is fetched again).
            self.close()
            raise
        taken, indices = self._steps.handed_out.popleft()
        if taken != step:  # the DataLoader returns results in the order it took them
            self.close()
            raise RuntimeError(f"prefetched step {taken!r} returned for {step!r}")
        return batch, indices

    def _start(self, plan: Iterator[Planned]) -> None:
        if self._iterator is not None:
            if self._steps.handed_out:
                self.replans += 1  # batches in flight are dropped (not a new epoch's start)
            if not self._options.persistent_workers:
                self.close()  # its workers end here; the next iterator starts its own
        self._steps.restart(plan)
        if self._loader is None:
            self._loader = self._make_loader()
        # Persistent workers: the DataLoader drops the results still in flight, unread.
        self._iterator = iter(self._loader)

    def _make_loader(self) -> DataLoader[Any]:
        options = self._options
        return DataLoader(
            self._dataset,
            batch_sampler=self._steps,
            collate_fn=_as_is,
            num_workers=options.num_workers,
            prefetch_factor=options.prefetch_factor,
            pin_memory=self._pin_memory,
            persistent_workers=options.persistent_workers,
            worker_init_fn=options.worker_init_fn,
            multiprocessing_context=options.multiprocessing_context,
            # Worker seeds come from a generator of their own: the DataLoader would
            # otherwise draw them from the global RNG, which the training state carries.
            generator=torch.Generator().manual_seed(self._seed),
        )

    def close(self) -> None:
        """Stop the workers now (they are started again at the next :meth:`take`)."""
        iterator, self._iterator, self._loader = self._iterator, None, None
        self._steps.restart(iter(()))
        # The iterator's destructor would do the same, but only once nothing refers to it.
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


#: Every prefetcher alive, to stop their workers at exit.
_live: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


def close_all() -> None:
    """Stop every loader's workers: at exit, a released worker's fast exit included (it
    runs the exit handlers), so that no worker process outlives the training process."""
    prefetchers: Sequence[Prefetcher] = list(_live)
    for prefetcher in prefetchers:
        prefetcher.close()


atexit.register(close_all)
