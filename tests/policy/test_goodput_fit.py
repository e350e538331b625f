"""Fitting the step-time model (Pollux's log-space fit with the overlap exponent)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.policy.api import ThroughputModel
from tidal.policy.goodput_model import StepSample, fit_throughput_model, step_time

TEMPLATE = ThroughputModel.unfitted(
    grad_noise_scale=1024.0, init_batch_size=128, max_local_batch=256, max_global_batch=8192
)

TRUE = replace(
    TEMPLATE,
    alpha_compute=0.05,
    beta_compute=0.002,
    alpha_sync_local=0.04,
    beta_sync_local=0.002,
    alpha_sync_node=0.2,
    beta_sync_node=0.01,
)

#: Every configuration the predictions are checked on: 1..64 workers, packed or spread.
WORKERS = np.array([1, 2, 3, 4, 8, 16, 64, 2, 4, 8, 16, 64], dtype=np.float64)
NODES = np.array([1, 1, 1, 1, 2, 4, 16, 2, 4, 8, 16, 64], dtype=np.float64)


def sample(model: ThroughputModel, workers: int, nodes: int, local: float) -> StepSample:
    """What a job would measure: the step time, and the part of it not spent computing."""
    total = float(step_time(model, workers, nodes, local))
    compute = model.alpha_compute + model.beta_compute * local
    return StepSample(workers, nodes, local, total, total - compute)


def grid(model: ThroughputModel) -> list[StepSample]:
    """Samples over worker counts, hosts and batches, as a profiled job would have."""
    return [
        sample(model, workers, nodes, local)
        for workers, nodes in ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 4), (32, 8))
        # Small batches too: there sync is not hidden behind compute, so it can be told.
        for local in (4.0, 32.0, 128.0)
    ]


def assert_sane(model: ThroughputModel) -> None:
    """Predicted step times are finite and positive everywhere, whatever the batch."""
    for local in (1.0, 64.0, 4096.0):
        times = step_time(model, WORKERS, NODES, np.full_like(WORKERS, local))
        assert np.all(np.isfinite(times)), times
        assert np.all(times > 0), times


@pytest.mark.parametrize("gamma", [1.0, 2.5, 4.0])
def test_fit_recovers_the_parameters_it_was_generated_with(gamma: float) -> None:
    model = replace(TRUE, gamma=gamma)
    fitted = fit_throughput_model(grid(model), TEMPLATE)
    assert fitted.gamma == pytest.approx(gamma, rel=0.05)
    for name in (
        "alpha_compute",
        "beta_compute",
        "alpha_sync_local",
        "beta_sync_local",
        "alpha_sync_node",
        "beta_sync_node",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(model, name), rel=0.05), name
    # Fields the fit does not touch come from the template.
    assert fitted.grad_noise_scale == TEMPLATE.grad_noise_scale
    assert fitted.max_global_batch == TEMPLATE.max_global_batch


def test_fit_with_overlap_predicts_what_a_linear_sum_cannot() -> None:
    # With gamma = 3 a step costs far less than compute + sync: a gamma-1 model of these
    # samples would over-rate the cost of adding workers.
    model = replace(TRUE, gamma=3.0)
    fitted = fit_throughput_model(grid(model), TEMPLATE)
    for workers, nodes in ((6, 2), (32, 8)):
        truth = float(step_time(model, workers, nodes, 100.0))
        assert float(step_time(fitted, workers, nodes, 100.0)) == pytest.approx(truth, rel=0.02)


def test_one_sample_splits_compute_in_half_and_predicts_itself() -> None:
    fitted = fit_throughput_model([StepSample(1, 1, 64.0, 0.3, 0.0)], TEMPLATE)
    assert fitted.alpha_compute == pytest.approx(0.15)
    assert fitted.beta_compute * 64.0 == pytest.approx(0.15, rel=1e-3)
    assert float(step_time(fitted, 1, 1, 64.0)) == pytest.approx(0.3, rel=1e-3)
    # Twice the batch costs more but less than twice as much (half the time is fixed).
    assert 0.3 < float(step_time(fitted, 1, 1, 128.0)) < 0.6
    assert_sane(fitted)


def test_two_samples_on_one_host_fit_both_and_price_spreading_above_one_host() -> None:
    samples = [StepSample(1, 1, 64.0, 0.3, 0.0), StepSample(2, 1, 64.0, 0.4, 0.1)]
    fitted = fit_throughput_model(samples, TEMPLATE)
    for s in samples:
        assert float(step_time(fitted, s.workers, s.nodes, 64.0)) == pytest.approx(
            s.step_time, rel=0.02
        )
    # Never measured across hosts: the prior makes it 10 % dearer than within one.
    assert fitted.alpha_sync_node >= 1.1 * fitted.alpha_sync_local - 1e-12
    assert float(step_time(fitted, 2, 2, 64.0)) >= float(step_time(fitted, 2, 1, 64.0))
    assert_sane(fitted)


def test_no_usable_sample_returns_the_template() -> None:
    assert fit_throughput_model([], TEMPLATE) == TEMPLATE
    assert fit_throughput_model([StepSample(1, 1, 8.0, math.nan, 0.0)], TEMPLATE) == TEMPLATE
    assert fit_throughput_model([StepSample(1, 1, 8.0, 0.0, 0.0)], TEMPLATE) == TEMPLATE


def test_a_failed_optimiser_falls_back_to_the_linear_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise ValueError("no convergence")

    monkeypatch.setattr(scipy.optimize, "least_squares", fail)
    fitted = fit_throughput_model(grid(TRUE), TEMPLATE)
    assert fitted.gamma == 1.0
    assert fitted.alpha_compute == pytest.approx(TRUE.alpha_compute, rel=1e-6)
    assert fitted.alpha_sync_node == pytest.approx(TRUE.alpha_sync_node, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([(1, 1), (2, 1), (4, 1), (4, 2), (8, 2), (16, 4)]),
            st.floats(1.0, 512.0),
            st.floats(1e-4, 10.0),
            st.floats(0.0, 1.5),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_any_measurements_give_finite_positive_predictions(
    rows: list[tuple[tuple[int, int], float, float, float]],
) -> None:
    # Noisy or contradictory timings included: a sync longer than the step, zero sync.
    samples = [
        StepSample(workers, nodes, local, step, step * share)
        for (workers, nodes), local, step, share in rows
    ]
    fitted = fit_throughput_model(samples, TEMPLATE)
    assert 1.0 <= fitted.gamma <= 10.0
    assert_sane(fitted)
