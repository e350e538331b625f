"""Sharding arithmetic and the loader alone (world of one)."""

from __future__ import annotations

import itertools

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import tidal
from tidal.runtime.data import shard_bounds, split_micro_batches, step_size


@given(batch=st.integers(1, 5000), world=st.integers(1, 64))
def test_shards_cover_the_batch_contiguously_and_evenly(batch: int, world: int) -> None:
    bounds = [shard_bounds(batch, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == batch
    for (_, hi), (lo, _) in itertools.pairwise(bounds):
        assert hi == lo
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the lowest ranks


@given(size=st.integers(1, 5000), limit=st.integers(1, 600))
def test_micro_batches_are_few_bounded_and_even(size: int, limit: int) -> None:
    sizes = split_micro_batches(size, limit)
    assert sum(sizes) == size
    assert max(sizes) <= limit
    assert len(sizes) == -(-size // limit)
    assert max(sizes) - min(sizes) <= 1


def test_loader_resumes_mid_epoch_exactly() -> None:
    data = TensorDataset(torch.arange(103).float())
    first = tidal.ElasticDataLoader(data, batch_size=10, seed=3)
    seen = [first.last_indices for _ in zip(range(4), first, strict=False)]
    resumed = tidal.ElasticDataLoader(data, batch_size=10, seed=0)
    resumed.load_state_dict(first.state_dict())
    rest = [resumed.last_indices for _ in resumed]
    flat = [i for batch in seen + rest for i in batch]
    assert sorted(flat) == list(range(103))
    assert [len(b) for b in rest][-1] == 3  # the last, partial batch is kept


def test_each_epoch_has_its_own_order() -> None:
    loader = tidal.ElasticDataLoader(TensorDataset(torch.arange(50).float()), batch_size=50)
    assert not torch.equal(loader.order(0), loader.order(1))
    assert torch.equal(loader.order(1), loader.order(1))


def test_last_global_indices_cover_the_epoch_in_order() -> None:
    data = TensorDataset(torch.arange(25).float())
    loader = tidal.ElasticDataLoader(data, batch_size=10, seed=5)
    assert loader.last_global_indices == []
    batches = []
    for _ in loader:
        # Alone, this rank's share is the whole global batch.
        assert loader.last_global_indices == loader.last_indices
        batches.append(loader.last_global_indices)
    assert [i for b in batches for i in b] == loader.order(0).tolist()


@given(
    n=st.integers(0, 3000),
    batch=st.integers(1, 600),
    world=st.integers(1, 16),
    drop_last=st.booleans(),
)
def test_steps_consume_the_whole_epoch_with_a_sample_per_rank(
    n: int, batch: int, world: int, drop_last: bool
) -> None:
    assume(batch >= world)  # a smaller global batch leaves some ranks without a sample
    position, sizes = 0, []
    while size := step_size(n - position, batch, world, drop_last):
        sizes.append(size)
        position += size
    assert all(size >= world for size in sizes)
    assert all(size <= batch + world - 1 for size in sizes)
    if drop_last:
        assert sizes == [batch] * (n // batch if batch >= world else 0)
    elif n >= world:
        # Nothing is left out, however the batch divides the epoch.
        assert position == n
        # A tail folded into the step before it saves that step.
        assert len(sizes) in (-(-n // batch), -(-n // batch) - 1)


def test_a_tail_smaller_than_the_world_is_trained_not_dropped() -> None:
    # 1797 samples, a global batch of 359 on 3 ranks: 5 full steps leave 2 samples.
    position, sizes = 0, []
    while size := step_size(1797 - position, 359, 3):
        sizes.append(size)
        position += size
    assert sizes == [359, 359, 359, 359, 358, 3]
