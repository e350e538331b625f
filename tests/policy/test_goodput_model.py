"""Goodput arithmetic: step time, efficiency, fitting and best batch."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from numpy.typing import ArrayLike

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import (
    FloatArray,
    best_batch,
    best_goodput_table,
    goodput,
    model_from_dict,
    model_to_dict,
    noise_scale,
    statistical_gain,
    step_time,
)

MODEL = ThroughputModel(
    alpha_compute=0.05,
    beta_compute=0.002,
    alpha_sync_local=0.01,
    beta_sync_local=0.002,
    alpha_sync_node=0.08,
    beta_sync_node=0.004,
    grad_noise_scale=1024.0,
    init_batch_size=128,
    max_local_batch=256,
    max_global_batch=8192,
)


def statistical_efficiency(model: ThroughputModel, global_batch: ArrayLike) -> FloatArray:
    """Progress per sample at ``global_batch`` relative to the initial batch (in ``(0, 1]``)."""
    scale = np.asarray(global_batch, dtype=np.float64) / max(model.init_batch_size, 1)
    return np.asarray(statistical_gain(model, global_batch) / scale, dtype=np.float64)


def test_gain_is_one_at_the_initial_batch_and_efficiency_falls_with_batch() -> None:
    assert float(statistical_gain(MODEL, 128)) == pytest.approx(1.0)
    eff = statistical_efficiency(MODEL, np.array([128, 256, 1024, 8192]))
    assert np.all(np.diff(eff) < 0)
    # (var + sqr) / (var / scale + sqr) with var / sqr = 1024 / 128 = 8, scale = 4.
    assert float(statistical_gain(MODEL, 512)) == pytest.approx(9 / (8 / 4 + 1))


def test_noise_scale_from_gradient_statistics() -> None:
    assert noise_scale(grad_sqr=2.0, grad_var=16.0, init_batch=128) == 1024.0
    assert math.isinf(noise_scale(grad_sqr=0.0, grad_var=1.0, init_batch=128))


def test_step_time_terms() -> None:
    assert float(step_time(MODEL, 1, 1, 100)) == pytest.approx(0.25)
    assert float(step_time(MODEL, 4, 1, 100)) == pytest.approx(0.25 + 0.01 + 0.002 * 2)
    assert float(step_time(MODEL, 8, 2, 100)) == pytest.approx(0.25 + 0.08 + 0.004 * 6)


def test_best_batch_beats_the_grid_neighbours_and_respects_limits() -> None:
    batch, value = best_batch(MODEL, 4, 1)
    assert 128 <= batch <= min(8192, 4 * 256)
    assert batch % 4 == 0
    for other in (128, 256, 512, 1024):
        assert value >= float(goodput(MODEL, 4, 1, other)) - 1e-12
    table, batches = best_goodput_table(MODEL, 16, 4)
    assert table[0] == 0.0 and batches[0] == 0.0
    assert table[4] == pytest.approx(value, rel=0.02)


# Sync dominates across hosts and the noise scale is large: bigger batches pay.
SYNC_BOUND = replace(
    MODEL,
    alpha_sync_node=1.0,
    grad_noise_scale=1e6,
    max_local_batch=32,
    max_global_batch=4096,
)


def test_accumulation_repeats_compute_but_not_sync() -> None:
    model = replace(SYNC_BOUND, gradient_accumulation=True)
    # 8 workers on 2 nodes at global batch 1024: 128 a worker, 4 micro-batches of 32.
    compute = 0.05 + 0.002 * 32
    step = float(step_time(model, 8, 2, 32)) + 3 * compute
    expected = float(statistical_gain(model, 1024)) / step
    assert float(goodput(model, 8, 2, 1024)) == pytest.approx(expected)
    # Within one micro-batch accumulation changes nothing.
    assert float(goodput(model, 8, 2, 256)) == pytest.approx(float(goodput(SYNC_BOUND, 8, 2, 256)))


def test_accumulation_opens_larger_batches_where_sync_dominates() -> None:
    _, without = best_goodput_table(SYNC_BOUND, 8, 4)
    table, with_accumulation = best_goodput_table(
        replace(SYNC_BOUND, gradient_accumulation=True), 8, 4
    )
    assert without[8] <= 8 * 32 + 1e-9
    assert with_accumulation[8] > 8 * 32
    assert table[8] > best_goodput_table(SYNC_BOUND, 8, 4)[0][8]
    batch, _ = best_batch(replace(SYNC_BOUND, gradient_accumulation=True), 8, 2)
    assert 8 * 32 < batch <= 4096


def test_batches_respect_the_smallest_share_per_worker() -> None:
    # Without a floor, 16 workers would split the initial batch of 128 into 8 each.
    model = replace(MODEL, grad_noise_scale=1.0, min_local_batch=24)
    _, batches = best_goodput_table(model, 16, 4)
    workers = np.arange(1, 17)
    assert np.all(batches[1:] >= np.maximum(128, 24 * workers) - 1e-6)
    batch, _ = best_batch(model, 16, 4)
    assert batch >= 16 * 24


def test_batch_limits_survive_a_round_trip_through_a_report() -> None:
    model = replace(MODEL, min_local_batch=24, gradient_accumulation=True)
    restored = model_from_dict(model_to_dict(model))
    assert restored == model
    assert restored.gradient_accumulation is True and isinstance(restored.min_local_batch, int)
    # A report from before these fields existed keeps the old behaviour.
    new_fields = ("min_local_batch", "gradient_accumulation")
    old = {k: v for k, v in model_to_dict(MODEL).items() if k not in new_fields}
    restored = model_from_dict(old)
    assert restored.min_local_batch == 1 and restored.gradient_accumulation is False
