"""Learning-rate schedules that follow training progress, not steps.

With an adaptive batch (``loader.autoscale_batch_size``) a step is worth more at a larger
batch, and the number of steps an epoch takes changes with the batch: a schedule counted
in steps decays too late once the batch grows. :func:`progress_lr` counts it in
*progress* instead, ``loader.adaptive.progress``: steps at the initial batch, the sum of
each step's AdaScale gain (as AdaptDL's and Pollux's schedules do). Without autoscale, a
step counts one, so the same schedule runs as a step-counted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from tidal.runtime.adaptive import AdaptiveBatch


def progress_of(loader: Any, steps: int) -> float:
    """Progress in initial-batch steps after ``steps`` optimizer steps: the loader's
    adaptive progress, or ``steps`` where the loader does not autoscale its batch.

    The runtime adds a step's gain when :meth:`tidal.State.step` commits it; a scheduler
    stepped before that (the usual loop) counts the step just taken at the current gain,
    so the rate of each step follows the progress of all the steps before it either way."""
    adaptive: AdaptiveBatch | None = getattr(loader, "adaptive", None)
    if adaptive is None:
        return float(steps)
    uncommitted = min(max(steps - adaptive.context.step, 0), 1)
    return adaptive.progress + uncommitted * adaptive.gain()


def progress_lr(
    optimizer: torch.optim.Optimizer, loader: Any, schedule: Callable[[float], float]
) -> LambdaLR:
    """An LR scheduler that sets each group's rate to its base rate times
    ``schedule(progress)``, ``progress`` counted in steps at the initial batch
    (:func:`progress_of`), so a decay planned for ``N`` steps at the initial batch ends
    after the same amount of training whatever batches the runtime chose.

    Call ``scheduler.step()`` once per optimizer step, as with any scheduler, and pass it
    to :class:`tidal.State` (``scheduler=``): its state is the step count and base rates
    (no function), and the progress it reads is part of the loader's state, so both roll
    back and travel together. With :func:`tidal.adaptive_lr` the two multiply: the
    schedule sets the base rate, the gain scales it for the current batch inside each
    ``step()``. ``schedule`` must return a finite number >= 0 (checked at every step).
    """

    def factor(steps: int) -> float:
        value = float(schedule(progress_of(loader, steps)))
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"schedule: expected a finite factor >= 0, got {value!r}")
        return value

    return LambdaLR(optimizer, factor)
