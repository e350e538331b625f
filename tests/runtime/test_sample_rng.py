"""Per-sample random numbers: a sample's mask does not depend on how the batch is split.

In-process, alone (world of one); ``test_dropout.py`` runs the same layers on 3 → 2
workers under ``tidal run``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

import tidal
from tidal.runtime.context import current
from tidal.runtime.data import shard_bounds
from tidal.runtime.sample_rng import stream_key, uniform
from tidal.runtime.sample_span import new_span


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 200), world=st.integers(1, 8), start=st.integers(0, 10**9))
def test_numbers_of_a_sample_do_not_depend_on_the_split(batch: int, world: int, start: int) -> None:
    world = min(world, batch)
    key = stream_key(7, 2, 3, 0)
    whole = uniform(key, torch.arange(start, start + batch), (3, 4), torch.float64)
    parts = []
    for rank in range(world):
        lo, hi = shard_bounds(batch, world, rank)
        parts.append(uniform(key, torch.arange(start + lo, start + hi), (3, 4), torch.float64))
    assert torch.equal(torch.cat(parts), whole)


def test_numbers_are_uniform_and_differ_by_key_and_sample() -> None:
    positions = torch.arange(0, 1000)
    a = uniform(stream_key(0, 0, 0, 0), positions, (100,), torch.float64)
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0
    assert abs(float(a.mean()) - 0.5) < 0.005
    assert abs(float((a < 0.3).double().mean()) - 0.3) < 0.005
    # Every part of the key matters: seed, epoch, stream, call; and so does the sample.
    for other in [(1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1)]:
        b = uniform(stream_key(*other), positions, (100,), torch.float64)
        assert float((a - b).abs().mean()) > 0.2
    assert float((a[1:] - a[:-1]).abs().mean()) > 0.2
    # Row-to-row and column-to-column correlations are those of independent numbers.
    centred = a - 0.5
    assert abs(float((centred[:, 1:] * centred[:, :-1]).mean())) < 0.002


def _span_of(start: int, count: int) -> None:
    current().sample_span = new_span(11, 0, start, count)


def test_dropout_masks_follow_the_sample_and_the_call() -> None:
    tidal.init()
    torch.manual_seed(0)
    model = tidal.per_sample_dropout(nn.Sequential(nn.Dropout(0.5)))
    assert isinstance(model, nn.Sequential)
    layer = model[0]
    assert isinstance(layer, tidal.PerSampleDropout)
    x = torch.ones(12, 50, dtype=torch.float64)
    _span_of(100, 12)
    whole, again = layer(x), layer(x)
    assert set(whole.unique().tolist()) == {0.0, 2.0}  # kept values scaled by 1 / (1 - p)
    assert not torch.equal(whole, again)  # a layer applied twice draws two masks
    _span_of(100, 5)
    first = layer(x[:5])
    _span_of(105, 7)
    second = layer(x[5:])
    assert torch.equal(torch.cat([first, second]), whole)  # split: the same masks
    _span_of(100, 12)
    assert torch.equal(layer(x), whole)  # a redone batch draws them again
    layer.eval()
    assert torch.equal(layer(x), x)


def test_channel_dropout_drops_whole_channels() -> None:
    tidal.init()
    model = tidal.per_sample_dropout(nn.Sequential(nn.Dropout2d(0.5), nn.Dropout(0.1)))
    assert isinstance(model, nn.Sequential)
    assert [m.stream for m in model if isinstance(m, tidal.PerSampleDropout)] == [0, 1]
    _span_of(0, 4)
    out = model[0](torch.ones(4, 16, 3, 3))
    per_channel = out.reshape(4, 16, 9)
    assert torch.equal(per_channel.amin(2), per_channel.amax(2))  # all or nothing
    assert 0 < int((per_channel[:, :, 0] == 0).sum()) < 64


def test_shared_layer_stays_shared_and_bad_input_is_named() -> None:
    tidal.init()
    drop = nn.Dropout(0.2)
    model = tidal.per_sample_dropout(nn.Sequential(nn.Linear(3, 3), drop, nn.Linear(3, 3), drop))
    assert isinstance(model, nn.Sequential)
    assert model[1] is model[3]
    _span_of(0, 4)
    with pytest.raises(ValueError, match="4 samples"):
        model[1](torch.ones(3, 3))
    with pytest.raises(ValueError, match="p: expected a probability"):
        tidal.PerSampleDropout(1.5, 0)


def test_the_loader_keys_each_micro_batch_by_its_own_samples() -> None:
    tidal.init()
    data = TensorDataset(torch.arange(40).float())
    loader = tidal.ElasticDataLoader(data, batch_size=20, seed=4)
    next(loader)
    span = current().sample_span
    assert span is not None and (span.seed, span.epoch, span.start, span.count) == (4, 0, 0, 20)
    next(loader)
    span = current().sample_span
    assert span is not None and (span.start, span.count) == (20, 20)
    values = torch.zeros(20, 1)
    drawn = tidal.sample_rand_like(values, stream=3)
    assert drawn.shape == (20, 1)
    assert torch.equal(tidal.sample_rand_like(values, stream=3), drawn)
    assert not torch.equal(tidal.sample_rand_like(values, stream=4), drawn)
