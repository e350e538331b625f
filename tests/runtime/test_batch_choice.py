"""The adaptive batch size's decision on plain values: limits, accumulation, re-choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import goodput, statistical_gain, step_time
from tidal.runtime.batch_choice import (
    RECHOOSE_GAIN,
    BatchLimits,
    accumulation_steps,
    batch_range,
    best_global_batch,
    configuration,
    fitted_model,
    next_batch,
    predicted_goodput,
    predicted_step_time,
)

LIMITS = BatchLimits(
    init_batch=64, max_global=4096, local_bounds=(8, 128), gradient_accumulation=True
)
MODEL = ThroughputModel(
    alpha_compute=0.001,
    beta_compute=0.0001,
    alpha_sync_local=0.02,
    beta_sync_local=0.0,
    alpha_sync_node=0.0,
    beta_sync_node=0.0,
    grad_noise_scale=500.0,
    init_batch_size=64,
    max_local_batch=128,
    max_global_batch=4096,
)


def test_batch_range_follows_the_local_bounds() -> None:
    # With accumulation the top is max_global; the bottom at least lo per worker.
    assert batch_range(LIMITS, 1) == (64, 4096)
    assert batch_range(LIMITS, 16) == (128, 4096)
    # Without accumulation a worker cannot take more than hi samples.
    plain = BatchLimits(64, 4096, (8, 128), gradient_accumulation=False)
    assert batch_range(plain, 4) == (64, 512)
    # A range that cannot hold the initial batch collapses onto its top.
    assert batch_range(BatchLimits(300, 4096, (8, 128), False), 2) == (256, 256)


def test_accumulation_splits_a_share_above_hi() -> None:
    assert accumulation_steps(LIMITS, 128) == 1
    assert accumulation_steps(LIMITS, 129) == 2
    assert configuration(LIMITS, 4, 1000) == (4, 1, 250.0, 2)
    plain = BatchLimits(64, 4096, (8, 128), gradient_accumulation=False)
    assert accumulation_steps(plain, 1000) == 1
    # Two micro-batches of 125: the first computes alone, the second overlaps the sync.
    expected = float(step_time(MODEL, 1, 1, 125)) + float(step_time(MODEL, 4, 1, 125))
    assert predicted_step_time(MODEL, LIMITS, 4, 1000) == pytest.approx(expected)


def test_an_epoch_needs_the_rechoose_gain_a_world_change_does_not() -> None:
    best = best_global_batch(MODEL, LIMITS, 8)
    near = int(best * 0.8)  # a fifth below the optimum: about 1% less goodput
    gain = predicted_goodput(MODEL, LIMITS, 8, best) / predicted_goodput(MODEL, LIMITS, 8, near)
    assert 1.0 < gain < RECHOOSE_GAIN
    # mypy takes pytest.approx in a tuple for a value no float can equal.
    assert next_batch(MODEL, LIMITS, 8, near, "world") == (best, pytest.approx(gain))  # type: ignore[comparison-overlap]
    assert next_batch(MODEL, LIMITS, 8, near, "epoch") == (near, pytest.approx(gain))  # type: ignore[comparison-overlap]
    # Far from the optimum the epoch boundary moves too.
    far = best // 2
    moved, far_gain = next_batch(MODEL, LIMITS, 8, far, "epoch")
    assert far_gain >= RECHOOSE_GAIN
    assert moved == best != far
    assert next_batch(MODEL, LIMITS, 8, best, "epoch") == (best, 1.0)


def test_fitted_model_without_timings_is_the_template() -> None:
    model = fitted_model({}, 123.0, LIMITS)
    assert (model.alpha_compute, model.beta_compute) == (0.0, 0.0)
    assert model.grad_noise_scale == 123.0
    assert (model.init_batch_size, model.max_local_batch, model.max_global_batch) == (64, 128, 4096)
    # The scheduler is told the range the runtime keeps: nothing below 8 a worker,
    # accumulation above 128.
    assert (model.min_local_batch, model.gradient_accumulation) == (8, True)
    # Timed configurations give a model that predicts them.
    profile = {configuration(LIMITS, 1, b): [(0.001 + 0.0001 * b, 0.0)] * 5 for b in (64, 128)}
    fitted = fitted_model(profile, 123.0, LIMITS)
    assert float(step_time(fitted, 1, 1, 128)) == pytest.approx(0.001 + 0.0128, rel=0.05)


def test_the_scheduler_predicts_an_accumulating_step_as_the_runtime_does() -> None:
    # What the job reports (its batch range included) is what the goodput policy plans
    # with: 1,000 samples on 4 workers are two micro-batches of 125 a worker on both sides.
    reported = replace(MODEL, min_local_batch=8, gradient_accumulation=True)
    runtime = predicted_step_time(reported, LIMITS, 4, 1000)
    policy = float(statistical_gain(reported, 1000)) / float(goodput(reported, 4, 1, 1000))
    assert policy == pytest.approx(runtime)
    # Without the flag the policy would plan one step of 250 a worker, which no worker runs.
    plain = float(statistical_gain(MODEL, 1000)) / float(goodput(MODEL, 4, 1, 1000))
    assert plain != pytest.approx(runtime)
