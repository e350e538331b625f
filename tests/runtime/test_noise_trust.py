"""When the noise estimate is trusted to choose the batch, and when a choice is looked at
again: the estimate's spread, the trust rule, and the cadence of looks."""

from __future__ import annotations

import math
import random
import statistics
from types import SimpleNamespace
from typing import Any

import pytest

from tidal.runtime.adaptive import RECHOOSE_STEPS, AdaptiveBatch
from tidal.runtime.batch_choice import steps_to_next_look
from tidal.runtime.gradient_noise import (
    MAX_NOISE_ERROR,
    MIN_NOISE_SAMPLES,
    TRUSTED_NOISE_SAMPLES,
    NoiseScaleEstimator,
    estimate_trusted,
)


class FakeLoader:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.micro_batch_size: int | None = None


def feed(estimator: NoiseScaleEstimator, grad_sqr: float, trace: float) -> None:
    """One step whose pair of norms (batches 1 and 2) gives exactly ``grad_sqr`` and
    ``trace``: ``E|g_b|² = |G|² + tr(Σ) / b``."""
    estimator.update(grad_sqr + trace, 1.0, grad_sqr + trace / 2, 2.0)


def test_relative_error_is_the_standard_error_of_the_two_means() -> None:
    """Nearly equal weights: the textbook standard errors of the per-step values."""
    rng = random.Random(0)
    estimator = NoiseScaleEstimator(smoothing=0.999999)
    sqrs = [rng.gauss(4.0, 1.0) for _ in range(40)]
    traces = [rng.gauss(400.0, 200.0) for _ in range(40)]
    assert estimator.relative_error == math.inf
    for g, t in zip(sqrs, traces, strict=True):
        feed(estimator, g, t)
    assert estimator.noise_scale == pytest.approx(
        statistics.fmean(traces) / statistics.fmean(sqrs), rel=1e-4
    )
    expected = math.sqrt(
        sum(statistics.variance(v) / len(v) / statistics.fmean(v) ** 2 for v in (sqrs, traces))
    )
    assert estimator.relative_error == pytest.approx(expected, rel=1e-3)


def test_relative_error_shrinks_with_samples_and_survives_the_state() -> None:
    rng = random.Random(1)
    estimator = NoiseScaleEstimator()
    errors = []
    for _ in range(60):
        feed(estimator, rng.gauss(1.0, 0.3), rng.gauss(100.0, 80.0))
        errors.append(estimator.relative_error)
    assert errors[0] == math.inf  # one sample has no spread
    assert errors[59] < errors[9] < errors[2]
    copy = NoiseScaleEstimator()
    copy.load_state_dict(estimator.state_dict())
    assert copy.relative_error == estimator.relative_error
    old = {k: v for k, v in estimator.state_dict().items() if not k.endswith("_sq")}
    copy.load_state_dict(old)  # a state saved before the spread was kept
    assert copy.relative_error == math.inf and copy.noise_scale == estimator.noise_scale


def test_trust_needs_a_small_spread_until_the_estimate_is_mature() -> None:
    assert not estimate_trusted(MIN_NOISE_SAMPLES - 1, 0.0)
    assert estimate_trusted(MIN_NOISE_SAMPLES, MAX_NOISE_ERROR)
    assert not estimate_trusted(MIN_NOISE_SAMPLES, MAX_NOISE_ERROR * 1.01)
    assert not estimate_trusted(TRUSTED_NOISE_SAMPLES - 1, math.inf)
    assert estimate_trusted(TRUSTED_NOISE_SAMPLES, math.inf)


def adaptive_with(estimates: list[tuple[float, float]]) -> AdaptiveBatch:
    """An adaptive batch at 32 on one worker, timed, with these (|G|², tr(Σ)) steps."""
    context: Any = SimpleNamespace(world_size=1, rank=0, parallel=None, step=0)
    adaptive = AdaptiveBatch(FakeLoader(32), context, 4096, (1, 4096), True)
    for g, t in estimates:
        feed(adaptive.noise, g, t)
    for batch in (32, 64):
        adaptive.profile[adaptive._config(1, batch)] = [(0.002 + 0.00001 * batch, 0.0)] * 5
    return adaptive


def test_a_consistent_estimate_decides_after_three_samples() -> None:
    steady = adaptive_with([(1.0, 500.0), (1.1, 520.0), (0.95, 480.0)])
    assert steady.noise.relative_error < MAX_NOISE_ERROR
    assert steady.ready()
    assert steady.proposal() > 32


def test_a_scattered_estimate_waits_for_more_samples() -> None:
    """Ten steps whose ratio scatters over orders of magnitude (as the first steps of a
    noisy task do) neither choose the batch nor move it."""
    scattered = [(1.0, 5.0), (0.01, 900.0), (2.0, 10.0), (0.02, 2000.0), (1.5, 40.0)] * 2
    adaptive = adaptive_with(scattered)
    assert adaptive.noise.relative_error > MAX_NOISE_ERROR
    assert not adaptive.ready()
    assert adaptive.proposal() == 0


def test_a_young_choice_is_looked_at_again_when_the_estimate_has_doubled() -> None:
    assert [steps_to_next_look(n, 50) for n in (0, 1, 3, 12, 49, 50, 400)] == [
        1,
        1,
        3,
        12,
        49,
        50,
        50,
    ]
    adaptive = adaptive_with([(1.0, 500.0), (1.1, 520.0), (0.95, 480.0)])
    adaptive.apply(adaptive.proposal())  # the first choice, on 3 samples
    batch = adaptive.loader.batch_size
    adaptive.profile[adaptive._config(1, batch)] = [(0.002 + 0.00001 * batch, 0.0)] * 5
    looks = []
    for step in range(1, 12):
        adaptive.note_batch(batch, batch)
        adaptive.end_step(timing=(0.01, 0.0))
        feed(adaptive.noise, 1.0, 500.0)
        if adaptive._pending is not None:
            looks.append(step)
            adaptive.proposal()
    # A look 3 steps after the first (3 samples then), 6 after that (6 then), and the
    # next one 12 later (12 at the look at step 9); at most every RECHOOSE_STEPS.
    assert looks == [3, 9]
    assert adaptive.state_dict()["look_after"] == 12 < RECHOOSE_STEPS
