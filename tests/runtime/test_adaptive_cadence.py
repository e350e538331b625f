"""The adaptive batch over time: the learning rate after a batch change (warm-up), and the
batch looked at again within a long epoch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tidal.runtime.adaptive import RECHOOSE_STEPS, AdaptiveBatch
from tidal.runtime.lr_scaling import adaptive_lr, current_factor, warmup_factor

WARMUP_STEPS = 10


class FakeLoader:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.micro_batch_size: int | None = None
        self.adaptive: AdaptiveBatch | None = None


def noise_dominated(init_batch: int = 64) -> tuple[FakeLoader, AdaptiveBatch]:
    """An adaptive batch whose gain equals the batch ratio (no signal in the noise)."""
    loader = FakeLoader(init_batch)
    context: Any = SimpleNamespace(world_size=1, rank=0, parallel=None, step=0)
    adaptive = AdaptiveBatch(loader, context, 4096, (1, 4096), True)
    loader.adaptive = adaptive
    adaptive.noise.sqr, adaptive.noise.var, adaptive.noise.weight = 1.0, 1e12, 1.0
    adaptive.warmup_steps = WARMUP_STEPS
    return loader, adaptive


def commit(adaptive: AdaptiveBatch) -> None:
    batch = adaptive.loader.batch_size
    adaptive.note_batch(batch, batch)
    adaptive.end_step(timing=(0.01, 0.0))


def test_warmup_factor_is_linear_then_the_new_one() -> None:
    assert warmup_factor(1.0, 4.0, 0, 10) == pytest.approx(1.3)
    assert warmup_factor(1.0, 4.0, 4, 10) == pytest.approx(2.5)
    assert warmup_factor(1.0, 4.0, 9, 10) == 4.0
    assert warmup_factor(1.0, 4.0, 50, 10) == 4.0
    assert warmup_factor(4.0, 1.0, 0, 10) == pytest.approx(3.7)  # down as well as up
    assert warmup_factor(1.0, 4.0, 0, 0) == 4.0  # switched off


def test_factor_after_a_batch_change_ramps_over_the_warmup_steps() -> None:
    _, adaptive = noise_dominated()
    assert current_factor(adaptive, "adascale") == 1.0
    adaptive.apply(256)
    factors = []
    for _ in range(WARMUP_STEPS + 2):
        factors.append(current_factor(adaptive, "adascale"))
        commit(adaptive)
    assert factors[0] == pytest.approx(1 + 3 / WARMUP_STEPS, rel=1e-6)
    assert factors == sorted(factors)
    assert factors[WARMUP_STEPS - 1 :] == pytest.approx([4.0] * 3, rel=1e-6)
    # Off (the default): the new batch's factor at once.
    adaptive.warmup_steps = AdaptiveBatch(
        FakeLoader(64), adaptive.context, 64, (1, 64), True
    ).warmup_steps
    adaptive.apply(128)
    assert current_factor(adaptive, "adascale") == pytest.approx(2.0, rel=1e-6)


def test_optimizer_step_right_after_a_change_is_warmed_up() -> None:
    loader, adaptive = noise_dominated()
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = adaptive_lr(torch.optim.SGD([param], lr=0.1), loader)
    adaptive.apply(256)
    param.grad = torch.ones(1)
    optimizer.step()
    # 1 + 3/10 of the way from the factor 1 at 64 to 4 at 256, not 4 at once.
    assert float(param.detach()) == pytest.approx(1 - 0.1 * (1 + 3 / WARMUP_STEPS), rel=1e-4)
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_warmup_survives_the_state() -> None:
    _, adaptive = noise_dominated()
    adaptive.apply(256)
    commit(adaptive)
    _, other = noise_dominated()
    other.load_state_dict(adaptive.state_dict())
    assert (other.previous_batch, other.steps_since_change) == (64, 1)
    # A state written before warm-up existed loads with none in progress.
    old = adaptive.state_dict()
    del old["previous_batch"], old["steps_since_change"]
    other.load_state_dict(old)
    assert other.previous_batch is None


def test_end_step_records_a_given_step_time() -> None:
    """A simulator replays modelled step times instead of this process's clock."""
    _, adaptive = noise_dominated()
    for _ in range(3):
        commit(adaptive)
    assert adaptive.profile[adaptive._config(1, 64)] == [(0.01, 0.0)] * 3
    assert adaptive.progress == pytest.approx(3.0)


def test_batch_is_looked_at_again_within_a_long_epoch() -> None:
    """An epoch of many steps does not hold a batch chosen from the first steps' noise."""
    _, adaptive = noise_dominated(init_batch=64)
    adaptive.noise.count = 100
    adaptive.profile[adaptive._config(1, 64)] = [(0.001 + 0.0001 * 64, 0.0)] * 5
    adaptive.profile[adaptive._config(1, 128)] = [(0.001 + 0.0001 * 128, 0.0)] * 5
    adaptive._pending = None  # the first decision was taken; no epoch boundary since
    for _ in range(RECHOOSE_STEPS - 1):
        commit(adaptive)
        assert adaptive.proposal() == 0
    commit(adaptive)
    best = adaptive.proposal()
    assert best == adaptive.best_batch(1) != 64
