"""Goodput arithmetic: step time, efficiency, fitting and best batch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import (
    best_batch,
    best_goodput_table,
    goodput,
    noise_scale,
    statistical_efficiency,
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
