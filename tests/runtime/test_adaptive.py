"""The adaptive batch size: noise scale, AdaScale gain, batch choice, state, LR wrapper."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tidal.runtime.adaptive import MIN_TIMING_SAMPLES, AdaptiveBatch
from tidal.runtime.gradient_noise import NoiseScaleEstimator, adascale_gain
from tidal.runtime.lr_scaling import adaptive_lr, lr_factor

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "adaptive_linear.py"
DIM, SIGMA = 10, 1.0
#: tr(Σ) / |G|² of the synthetic problem below, with |d| = 1.
ANALYTIC = (DIM + 1) + DIM * SIGMA**2


class FakeLoader:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.micro_batch_size: int | None = None


def fake_context(world: int = 1, rank: int = 0) -> Any:
    return SimpleNamespace(world_size=world, rank=rank, parallel=None, step=0)


def make(
    batch: int = 64, world: int = 1, max_global: int = 4096, bounds: tuple[int, int] = (1, 512)
) -> AdaptiveBatch:
    return AdaptiveBatch(FakeLoader(batch), fake_context(world), max_global, bounds, True)


def per_sample_gradients(n: int, generator: torch.Generator) -> torch.Tensor:
    """Linear regression at w = w* + d, d = e_1: g_i = x_i (x_i . d - sigma eps_i)."""
    x = torch.randn(n, DIM, generator=generator, dtype=torch.float64)
    eps = torch.randn(n, generator=generator, dtype=torch.float64)
    return x * (x[:, 0] - SIGMA * eps)[:, None]


def test_noise_scale_of_linear_regression_within_20_percent() -> None:
    """Four ranks of 16 samples, through the same code path as training: each rank's
    local norm in the agreement, the reduced gradient's norm kept locally."""
    generator = torch.Generator().manual_seed(1)
    world, batch = 4, 64
    ranks = [
        AdaptiveBatch(FakeLoader(batch), fake_context(world, r), batch, (1, batch), False)
        for r in range(world)
    ]
    for _ in range(300):
        grads = per_sample_gradients(batch, generator)
        mean = grads.mean(0)
        slots: list[list[float]] = []
        for r, adaptive in enumerate(ranks):
            local = grads[16 * r : 16 * (r + 1)].mean(0)
            adaptive.note_batch(16, batch)
            adaptive.recorder.before(0, local)  # what the gradient hook sees
            adaptive.recorder.after(mean)
            adaptive.end_step()
            slots.append(adaptive.agreement_values())
        reduced = [max(column) for column in zip(*slots, strict=True)]  # the MAX all-reduce
        for adaptive in ranks:
            adaptive.absorb(reduced)
    estimates = {adaptive.noise.noise_scale for adaptive in ranks}
    assert len(estimates) == 1, "ranks must hold the same statistics"
    (estimate,) = estimates
    assert abs(estimate / ANALYTIC - 1) < 0.2, (estimate, ANALYTIC)


def test_noise_scale_alone_from_successive_steps() -> None:
    """World 1: two successive batches stand in for two workers."""
    generator = torch.Generator().manual_seed(2)
    estimator = NoiseScaleEstimator()
    previous = None
    for _ in range(400):
        g = per_sample_gradients(32, generator).mean(0)
        if previous is not None:
            both = previous + g
            small = float(previous @ previous + g @ g) / 2
            estimator.update(small, 32, float(both @ both) / 4, 64)
        previous = g
    assert abs(estimator.noise_scale / ANALYTIC - 1) < 0.2, estimator.noise_scale


@pytest.mark.slow
def test_noise_scale_alone_through_the_gradient_hook(tmp_path: Path) -> None:
    """The real hook, alone (no launcher): successive steps' gradients."""
    env = dict(os.environ)
    env.pop("TIDAL_STORE", None)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "300", "--sigma", str(SIGMA)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["samples"] > 250
    assert abs(result["estimate"] / result["analytic"] - 1) < 0.2, result


def test_adascale_gain_is_one_at_the_initial_batch_and_within_bounds() -> None:
    for noise in (0.0, 10.0, 500.0, math.inf):
        assert adascale_gain(noise, 64, 64) == pytest.approx(1.0)
        previous = 1.0
        for batch in (65, 128, 256, 1024, 8192):
            gain = adascale_gain(noise, 64, batch)
            assert 1.0 <= gain <= batch / 64
            assert gain >= previous - 1e-12  # more samples per step are never worth less
            previous = gain
    # A large noise scale makes a bigger batch worth almost its size in initial steps.
    assert adascale_gain(1e6, 64, 256) == pytest.approx(4.0, rel=1e-3)
    assert adascale_gain(0.0, 64, 256) == pytest.approx(1.0)


def test_lr_rules() -> None:
    assert lr_factor("adascale", 3.0, 4.0) == 3.0
    assert lr_factor("adamscale", 4.0, 4.0) == 2.0
    assert lr_factor("sqrt", 3.0, 4.0) == 2.0
    assert lr_factor("linear", 3.0, 4.0) == 4.0
    with pytest.raises(ValueError, match="rule"):
        lr_factor("cosine", 1.0, 1.0)


def trained(adaptive: AdaptiveBatch, workers: int, batch: int, noise: float = 2000.0) -> None:
    """Give ``adaptive`` statistics and step times: compute 1 ms + 0.1 ms per sample,
    sync 20 ms beyond one worker."""
    adaptive.noise.sqr, adaptive.noise.var = 1.0, noise
    adaptive.noise.weight, adaptive.noise.count = 1.0, 100
    for w, b in ((1, batch), (2, batch), (workers, batch), (workers, 2 * batch)):
        local = b / w
        step = 0.001 + 0.0001 * local + (0.02 if w > 1 else 0.0)
        adaptive.profile[adaptive._config(w, b)] = [(step, 0.02 if w > 1 else 0.0)] * 5


def test_chosen_batch_changes_with_the_workers() -> None:
    adaptive = make(batch=64, world=1)
    trained(adaptive, 8, 64)
    one, eight = adaptive.best_batch(1), adaptive.best_batch(8)
    # More workers: the sync cost is amortised over a larger batch.
    assert eight > one, (one, eight)
    # And the choice travels through proposal(): pending after a generation change.
    adaptive.context.world_size = 8
    adaptive.on_generation()
    assert adaptive.proposal() == eight
    adaptive.apply(eight)
    assert adaptive.loader.batch_size == eight
    adaptive.context.world_size = 1
    adaptive.on_generation()
    # The new world is decided at once from the fitted model, not after steps at a
    # batch sized for eight workers' sync, and looked at again once it is timed.
    assert adaptive.profile.get(adaptive._config(1, eight)) is None
    assert adaptive.proposal() == adaptive.best_batch(1) != eight
    assert adaptive.state_dict()["look_after"] == MIN_TIMING_SAMPLES


def test_the_first_choice_waits_for_timings() -> None:
    """Nothing timed yet: no model to extrapolate, whatever the noise estimate says."""
    adaptive = make(batch=64, world=2)
    trained(adaptive, 2, 64)
    adaptive.profile.clear()
    assert adaptive.noise.count >= 50 and not adaptive.measured()
    assert adaptive.proposal() == 0
    for _ in range(MIN_TIMING_SAMPLES):
        adaptive.note_batch(32, 64)
        adaptive.end_step(timing=(0.01, 0.005))
    assert adaptive.proposal() == adaptive.best_batch(2) != 64


def test_epoch_boundary_needs_a_5_percent_gain() -> None:
    adaptive = make(batch=64, world=8)
    trained(adaptive, 8, 64)
    adaptive._pending = None
    best = adaptive.best_batch(8)
    adaptive.apply(best)
    adaptive.on_epoch()
    assert adaptive.proposal() == 0  # already at the best batch
    # Nearly as good: a neighbour of the optimum is not worth a change at an epoch.
    near = best + 8
    model = adaptive.model()
    assert (
        adaptive.predicted_goodput(8, best, model) / adaptive.predicted_goodput(8, near, model)
        < 1.05
    )
    adaptive.apply(near)
    adaptive.profile[adaptive._config(8, near)] = [(0.02 + 0.0001 * near / 8, 0.02)] * 5
    adaptive.on_epoch()
    assert adaptive.proposal() == 0


def test_state_round_trip() -> None:
    adaptive = make(batch=64, world=4)
    trained(adaptive, 4, 64)
    adaptive.progress = 12.5
    adaptive.apply(adaptive.best_batch(4))
    state = adaptive.state_dict()
    other = make(batch=32, world=4)
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.init_batch == 64
    assert other.best_batch(4) == adaptive.best_batch(4)
    assert other.noise.noise_scale == adaptive.noise.noise_scale
    assert other.model() == adaptive.model()


def test_report_is_plain_json() -> None:
    adaptive = make(batch=64, world=2)
    trained(adaptive, 2, 64, noise=math.inf)
    report = adaptive.report()
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text)["batch_size"] == 64
    assert report["efficiency"] == 1.0  # at the initial batch
    # Sync-bound at 32 per worker: two workers are slower than one at the same batch.
    assert 0 < report["speedup"] < 1


def test_single_batch_size_prior_does_not_make_batches_free() -> None:
    adaptive = make(batch=64, world=1)
    adaptive.profile[adaptive._config(1, 64)] = [(0.064, 0.0)] * 5
    model = adaptive.model()
    # Half fixed, half per sample: doubling the batch costs 1.5x, not 1x nor 2x.
    ratio = adaptive.predicted_step_time(1, 128, model) / adaptive.predicted_step_time(1, 64, model)
    assert ratio == pytest.approx(1.5)


def test_adaptive_lr_scales_only_inside_step() -> None:
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    loader = FakeLoader(256)
    adaptive = AdaptiveBatch(loader, fake_context(), 1024, (1, 1024), True)
    loader.adaptive = adaptive  # type: ignore[attr-defined]
    adaptive.init_batch = 64
    adaptive.noise.sqr, adaptive.noise.var, adaptive.noise.weight = 1.0, 1e9, 1.0
    adaptive_lr(optimizer, loader)
    param.grad = torch.ones(1)
    optimizer.step()
    # Noise-dominated: the gain is ~4 at 4x the batch, so the step is ~4 x 0.1.
    assert float(param.detach()) == pytest.approx(1 - 0.4, rel=1e-3)
    assert optimizer.param_groups[0]["lr"] == 0.1  # put back for schedulers/checkpoints
    adam = torch.optim.Adam([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    adaptive_lr(adam, loader)  # auto: adamscale for optimizers with betas
