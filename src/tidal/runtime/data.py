"""A data loader whose global batch stays fixed while the world changes.

Each epoch visits a permutation drawn from ``(seed, epoch)``. The loader's position counts
the samples of the epoch already consumed by the whole job; each step takes the next
``batch_size`` of them and splits that global batch over the current ranks (contiguous
slices, the first ``batch % world`` ranks one sample more). A membership change therefore
re-shards exactly the samples the epoch has not used yet: none is skipped or repeated.

With ``num_workers > 0`` worker processes fetch the next steps ahead
(:mod:`tidal.runtime.prefetch`); the position still moves only when a batch is consumed, and
a batch prefetched for a world, batch size or position that then changed is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.context import WorkerContext, current
from tidal.runtime.prefetch import Planned, Prefetcher, PrefetchOptions, fetch_samples
from tidal.runtime.sample_span import SampleSpan, new_span


def shard_bounds(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a ``batch`` that ``rank`` of ``world`` computes."""
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def step_size(remaining: int, batch: int, world: int, drop_last: bool = False) -> int:
    """Samples the whole job takes at the next step, or 0 when the epoch is over.

    Every rank needs at least one sample, so a step never leaves a tail smaller than the
    world behind: when ``batch`` would, the step gives up enough samples for the final step
    to have one per rank (or, with a batch too small to spare them, takes the tail along).
    A tail can still fall short if the world grows just before the final step; it is then
    left out of the epoch, the only case where a sample is.
    """
    if remaining < world or remaining <= 0 or (drop_last and remaining < batch):
        return 0
    size = min(batch, remaining)
    tail = remaining - size
    if drop_last or batch < world or not 0 < tail < world:
        return size
    if size - (world - tail) >= world:
        return size - (world - tail)
    return remaining


def epoch_order(length: int, seed: int, shuffle: bool, epoch: int) -> torch.Tensor:
    """The sample order of ``epoch``: a permutation drawn from ``(seed, epoch)``."""
    if not shuffle:
        return torch.arange(length)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(length, generator=g)


class _Step(NamedTuple):
    """One step of this rank: the samples ``[start, start + size)`` of ``epoch``'s order
    (of a dataset of ``length`` ordered by ``seed``, ``shuffle``), its ``rank``'s share."""

    seed: int
    shuffle: bool
    length: int
    epoch: int
    start: int
    size: int
    world: int
    rank: int


def _plan(first: _Step, batch_size: int, drop_last: bool) -> Iterator[Planned]:
    """This rank's steps from ``first`` to the end of its epoch, as the loader takes them if
    the world, the batch size and the position do not change.

    The plan stops at the epoch's end, as a DataLoader's sampler does: reading on into the
    next epoch would read, after the last epoch a job runs, up to ``num_workers x
    prefetch_factor`` batches that nobody takes (their CPU taken from other jobs).
    """
    seed, shuffle, n, epoch, position, _, world, rank = first
    order = epoch_order(n, seed, shuffle, epoch)
    while True:
        size = step_size(n - position, batch_size, world, drop_last)
        if size == 0:
            return
        lo, hi = shard_bounds(size, world, rank)
        step = _Step(seed, shuffle, n, epoch, position, size, world, rank)
        yield step, order[position + lo : position + hi].tolist()
        position += size


def split_micro_batches(size: int, limit: int) -> list[int]:
    """Sizes of the fewest micro-batches of at most ``limit`` covering ``size`` samples,
    as even as possible (they differ by at most one)."""
    if size <= limit:
        return [size]
    count = -(-size // limit)
    base, extra = divmod(size, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


class ElasticDataLoader:
    """Iterate over this rank's share of each global batch of ``dataset``.

    ``batch_size`` is the *global* batch: what the job computes per step, whatever the
    number of workers. With ``micro_batch_size`` set, iterate ``loader.micro_batches(batch)``
    inside a step to accumulate gradients over pieces of at most that size.
    Every rank needs a sample, so a step before the last may be a few samples short of
    ``batch_size`` to leave the final step one per rank (see :func:`step_size`).
    :meth:`autoscale_batch_size` lets the runtime choose the global batch instead.

    ``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``,
    ``worker_init_fn`` and ``multiprocessing_context`` mean what they mean to
    :class:`torch.utils.data.DataLoader`, whose workers fetch the batches ahead; memory is
    pinned only when the worker trains on a CUDA device. ``dataset`` is map-style (an
    :class:`~torch.utils.data.IterableDataset` has no positions to shard and resume from).
    """

    def __init__(
        self,
        dataset: Dataset[Any] | Sequence[Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        micro_batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        prefetch_factor: int | None = None,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                "dataset: expected a map-style dataset (__len__ and __getitem__), got an "
                f"IterableDataset ({type(dataset).__name__}): its samples have no positions "
                "to split over the ranks and to resume from"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(
                f"micro_batch_size: expected an integer >= 1 or None, got {micro_batch_size!r}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.micro_batch_size = micro_batch_size
        self.collate_fn = collate_fn or default_collate
        self.epoch = 0
        #: Samples of the current epoch consumed by the whole job.
        self.position = 0
        #: Dataset indices of this rank's last batch (for audits and tests).
        self.last_indices: list[int] = []
        self._context: WorkerContext = current()
        self.prefetch_options = PrefetchOptions(
            num_workers,
            prefetch_factor,
            pin_memory,
            persistent_workers,
            worker_init_fn,
            multiprocessing_context,
        )
        self.prefetch_options.check()
        self._prefetch: Prefetcher | None = None
        #: The adaptive batch size, once :meth:`autoscale_batch_size` switched it on.
        self.adaptive: AdaptiveBatch | None = None
        self._order_key: tuple[int, int, bool, int] | None = None
        self._order = torch.empty(0, dtype=torch.long)
        #: The epoch's order on the GPU that holds a TensorDataset (see _on_data_device).
        self._device_order: tuple[tuple[int, int, bool, int] | None, torch.Tensor] | None = None
        self._last_span: tuple[int, int, int] | None = None

    def autoscale_batch_size(
        self,
        max_global: int,
        local_bounds: tuple[int, int] | None = None,
        gradient_accumulation: bool = True,
    ) -> AdaptiveBatch:
        """Let the runtime choose the global batch, between the current ``batch_size`` and
        ``max_global``, to maximise goodput for the current world (see
        :mod:`tidal.runtime.adaptive`). ``local_bounds=(lo, hi)`` bounds each worker's
        share; with ``gradient_accumulation`` a share above ``hi`` is computed in
        micro-batches of at most ``hi`` (iterate ``loader.micro_batches(batch)``), without
        it the global batch stays within ``hi`` x workers. Pair it with
        :func:`tidal.adaptive_lr` so the learning rate follows the batch.
        """
        bounds = local_bounds if local_bounds is not None else (1, max_global)
        self.adaptive = AdaptiveBatch(
            self, self._context, max_global, bounds, gradient_accumulation
        )
        return self.adaptive

    def __len__(self) -> int:
        """Number of steps in a full epoch."""
        n = len(self.dataset)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def last_global_indices(self) -> list[int]:
        """Dataset indices of the last step's whole global batch (every rank's share, in
        rank order); for audits: a rank that survives a peer lost mid-step can still
        commit that peer's samples."""
        if self._last_span is None:
            return []
        epoch, start, end = self._last_span
        return self.order(epoch)[start:end].tolist()

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's sample order (the same on every rank)."""
        key = (len(self.dataset), self.seed, self.shuffle, epoch)  # type: ignore[arg-type]
        if self._order_key != key:
            self._order = epoch_order(*key)
            self._order_key = key
        return self._order

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        n = len(self.dataset)  # type: ignore[arg-type]
        world, rank = self._context.world_size, self._context.rank
        size = step_size(n - self.position, self.batch_size, world, self.drop_last)
        if size == 0:
            if self._prefetch is not None and not self.prefetch_options.persistent_workers:
                self._prefetch.close()  # as a DataLoader's workers end with the epoch
            raise StopIteration
        lo, hi = shard_bounds(size, world, rank)
        start = self.position
        if self.prefetch_options.num_workers > 0:
            return self._take(
                _Step(self.seed, self.shuffle, n, self.epoch, start, size, world, rank)
            )
        indices = self.order(self.epoch)[start + lo : start + hi]
        self._consume(start, size, lo, hi, indices.tolist())
        return self._fetch(self._on_data_device(indices, start + lo, start + hi))

    def _on_data_device(self, indices: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``indices`` (``order[lo:hi]``) where a :class:`TensorDataset` keeps its tensors:
        on a GPU, a slice of the epoch's order copied there once (asynchronously, from
        pinned memory), not a copy of each step's indices per tensor; launching those
        copies cost a small model's step more than its kernels did."""
        if not isinstance(self.dataset, TensorDataset) or not self.dataset.tensors:
            return indices
        tensors = self.dataset.tensors
        device = tensors[0].device
        if device.type != "cuda" or any(t.device != device for t in tensors):
            return indices
        cached = self._device_order
        if cached is None or cached[0] != self._order_key or cached[1].device != device:
            on_device = self._order.pin_memory().to(device, non_blocking=True)
            cached = self._device_order = (self._order_key, on_device)
        return cached[1][lo:hi]

    def _consume(self, start: int, size: int, lo: int, hi: int, indices: list[int]) -> None:
        """Move the position past the step taken, and tell the runtime what it holds."""
        self.position += size
        self.last_indices = indices
        self._last_span = (self.epoch, start, start + size)
        # Where this rank's samples sit in the job's data: the key of per-sample dropout.
        self._context.sample_span = new_span(self.seed, self.epoch, start + lo, hi - lo)
        if self._context.parallel is not None:
            self._context.parallel.set_batch_share(hi - lo, size)
        if self.adaptive is not None:
            self.adaptive.note_batch(hi - lo, size)

    def _fetch(self, indices: torch.Tensor) -> Any:
        batch = fetch_samples(self.dataset, indices, self.collate_fn)
        device = self._context.device
        if device.type != "cpu":
            batch = _to_device(batch, device)
        return batch

    def _take(self, step: _Step) -> Any:
        """The step's batch from the workers; the position moves once it is in hand."""
        if self._prefetch is None:
            device = self._context.device
            self._prefetch = Prefetcher(
                self.dataset,
                self.collate_fn,
                self.prefetch_options,
                pin_memory=self.prefetch_options.pin_memory and device.type == "cuda",
                seed=self.seed,
            )
        batch, indices = self._prefetch.take(
            step, lambda: _plan(step, self.batch_size, self.drop_last)
        )
        lo, hi = shard_bounds(step.size, step.world, step.rank)
        self._consume(step.start, step.size, lo, hi, indices)
        device = self._context.device
        if device.type != "cpu":
            batch = _to_device(batch, device)  # non-blocking: from pinned memory, async
        return batch

    def close(self) -> None:
        """Stop the worker processes now (they start again if the loader is iterated);
        they also stop when the loader is garbage-collected and when the process exits."""
        if self._prefetch is not None:
            self._prefetch.close()

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        """Pieces of ``batch`` to run forward/backward on one after another; gradients are
        accumulated locally and synchronised once, after the last piece."""
        size = _batch_len(batch)
        parallel = self._context.parallel
        if self.micro_batch_size is None or size <= self.micro_batch_size or parallel is None:
            yield batch
            return
        sizes = split_micro_batches(size, self.micro_batch_size)
        whole: SampleSpan | None = self._context.sample_span
        offset = 0
        for i, piece in enumerate(sizes):
            if whole is not None and whole.count == size:
                self._context.sample_span = new_span(
                    whole.seed, whole.epoch, whole.start + offset, piece
                )
            with parallel.micro_batch(piece / size, sync=i == len(sizes) - 1):
                yield _slice(batch, offset, offset + piece)
            offset += piece

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch = epoch
        self.position = 0
        if self.adaptive is not None:
            self.adaptive.on_epoch()

    def state_dict(self) -> dict[str, Any]:
        """Position in the data: enough to resume exactly, on any number of workers (with
        autoscale, also what the adaptive batch size has learnt)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "adaptive": self.adaptive.state_dict() if self.adaptive is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state["seed"])
        self.batch_size = int(state["batch_size"])
        if self.adaptive is not None and state.get("adaptive") is not None:
            self.adaptive.load_state_dict(state["adaptive"])


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, tuple | list):
        return _batch_len(batch[0])
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")


def _slice(batch: Any, lo: int, hi: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[lo:hi]
    if isinstance(batch, tuple | list):
        return type(batch)(_slice(b, lo, hi) for b in batch)
    if isinstance(batch, dict):
        return {k: _slice(v, lo, hi) for k, v in batch.items()}
    return batch


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
