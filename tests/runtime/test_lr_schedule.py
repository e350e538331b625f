"""A learning-rate schedule that follows the adaptive batch's progress, not steps."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.lr_schedule import progress_lr, progress_of

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "progress_schedule.py"


class FakeLoader:
    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.micro_batch_size: int | None = None
        self.adaptive: AdaptiveBatch | None = None


def autoscaled(batch: int, init: int) -> FakeLoader:
    """A loader at ``batch`` whose adaptive batch started at ``init``, noise-dominated."""
    loader = FakeLoader(init)
    context = SimpleNamespace(world_size=1, rank=0, parallel=None, step=0)
    loader.adaptive = AdaptiveBatch(loader, context, 4096, (1, 4096), True)  # type: ignore[arg-type]
    loader.adaptive.noise.sqr, loader.adaptive.noise.var = 1.0, 1e9
    loader.adaptive.noise.weight = 1.0
    loader.batch_size = batch
    return loader


def test_progress_is_the_step_count_without_autoscale() -> None:
    assert progress_of(FakeLoader(64), 7) == 7.0


def test_progress_counts_the_uncommitted_step_at_its_gain() -> None:
    loader = autoscaled(256, 64)
    adaptive: Any = loader.adaptive
    adaptive.progress, adaptive.context.step = 10.0, 3
    gain = adaptive.gain()
    assert gain == pytest.approx(4.0, rel=1e-3)
    # The scheduler is stepped before the state commits step 4 (the usual loop) ...
    assert progress_of(loader, 4) == pytest.approx(10.0 + gain)
    # ... or after it: the committed progress is all there is.
    assert progress_of(loader, 3) == 10.0


def test_schedule_sets_the_base_rate_from_progress() -> None:
    loader = autoscaled(256, 64)
    adaptive: Any = loader.adaptive
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = progress_lr(optimizer, loader, lambda p: 1.0 / (1.0 + p))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # progress 0
    for step in range(1, 4):
        optimizer.step()
        scheduler.step()
        adaptive.progress += adaptive.gain()  # what State.step() adds when it commits
        adaptive.context.step = step
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / (1.0 + adaptive.progress))
    # Four initial-batch steps a step: a step-counted schedule would still be at 1 / 4.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 13.0, rel=1e-3)
    # Its state is plain data: no function, no loader.
    state = scheduler.state_dict()
    assert state["lr_lambdas"] == [None]
    assert "loader" not in json.dumps(state, default=str)


def test_a_bad_schedule_value_names_the_schedule() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(ValueError, match="schedule: expected a finite factor >= 0"):
        progress_lr(optimizer, FakeLoader(64), lambda p: float("nan"))


def test_schedule_follows_progress_through_the_real_loader() -> None:
    """Alone (no launcher): the rate before each step is the schedule of the progress of
    the steps before it, while the runtime raises the batch from 16 to 128."""
    env = dict(os.environ)
    env.pop("TIDAL_STORE", None)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "30", "--raised", "128"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 30 and result["batch"] == 128
    records = result["records"]
    assert len(records) == 30
    for lr, progress, _ in records:
        assert lr == pytest.approx(0.01 / (1.0 + progress / 10.0), rel=1e-9)
    batches = [b for _, _, b in records]
    raised = batches.index(128)
    assert raised > 0 and set(batches[:raised]) == {16} and set(batches[raised:]) == {128}
    # One per step at 16, then each step at 128 worth its gain (> 1): ahead of the steps.
    progress = [p for _, p, _ in records]
    assert progress[: raised + 1] == pytest.approx(list(range(raised + 1)))
    assert all(b - a > 1.0 for a, b in itertools.pairwise(progress[raised:]))
    assert result["progress"] > 30
    assert result["lr"] == pytest.approx(0.01 / (1.0 + result["progress"] / 10.0), rel=1e-9)
