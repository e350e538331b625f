"""The learning rate that follows the adaptive batch (AdaScale, AdamScale).

A step at a larger batch moves the model further than one at the initial batch only if the
learning rate grows with it. :func:`adaptive_lr` wraps an optimizer's ``step()`` so that
each step runs at the base rate times :func:`lr_factor` of the current batch: the AdaScale
gain ``r = (var + sqr) / (var / scale + sqr)``, in ``[1, scale]``, for SGD, ``sqrt(r)``
(AdamScale) for Adam-like optimizers. The gain comes from the loader's
:class:`~tidal.runtime.adaptive.AdaptiveBatch`.

With ``AdaptiveBatch.warmup_steps`` set, the factor does not jump after a batch change: it
moves linearly from the old batch's factor to the new one's over that many steps
(:func:`warmup_factor`), as a learning-rate warm-up does after a batch is raised (Goyal et
al. 2017). It is off by default: measured, it cost time to accuracy (see
:data:`tidal.runtime.adaptive.WARMUP_STEPS`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from tidal.runtime.adaptive import AdaptiveBatch


def lr_factor(rule: str, gain: float, scale: float) -> float:
    """Multiplier of the learning rate at batch ``scale`` x the initial one.

    ``adascale``: the gain (SGD); ``adamscale``: its square root (Adam-like); ``sqrt``:
    ``sqrt(scale)``; ``linear``: ``scale``.
    """
    if rule == "adascale":
        return gain
    if rule == "adamscale":
        return math.sqrt(gain)
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "linear":
        return scale
    raise ValueError(f"rule: expected adascale, adamscale, sqrt or linear, got {rule!r}")


def warmup_factor(before: float, after: float, steps: int, warmup_steps: int) -> float:
    """The factor ``steps`` steps after a change from ``before`` to ``after``: linear over
    ``warmup_steps`` steps (the first step already one ``warmup_steps``-th of the way),
    ``after`` from then on."""
    if warmup_steps <= 0 or steps + 1 >= warmup_steps:
        return after
    fraction = (max(steps, 0) + 1) / warmup_steps
    return before + (after - before) * fraction


def current_factor(adaptive: AdaptiveBatch, rule: str) -> float:
    """The learning-rate multiplier of the next step: :func:`lr_factor` of the current
    batch, warmed up from the previous batch's after a change (:func:`warmup_factor`)."""
    init = max(adaptive.init_batch, 1)
    batch = adaptive.loader.batch_size
    after = lr_factor(rule, adaptive.gain(), batch / init)
    previous = adaptive.previous_batch
    if previous is None or adaptive.steps_since_change >= adaptive.warmup_steps:
        return after
    before = lr_factor(rule, adaptive.gain_at(previous), previous / init)
    return warmup_factor(before, after, adaptive.steps_since_change, adaptive.warmup_steps)


def adaptive_lr(
    optimizer: torch.optim.Optimizer, loader: Any, rule: str = "auto"
) -> torch.optim.Optimizer:
    """Make ``optimizer`` follow the adaptive batch: each ``step()`` runs with every
    group's learning rate multiplied by :func:`lr_factor` of the current batch, then puts
    the rates back (so LR schedulers and checkpoints see the base rates).

    ``rule="auto"`` is ``adamscale`` for optimizers with ``betas`` (Adam, AdamW, ...) and
    ``adascale`` otherwise. Returns the same optimizer; call it before building
    :class:`tidal.State`. Without autoscale on the loader the factor is 1.
    """
    if rule == "auto":
        rule = "adamscale" if "betas" in optimizer.defaults else "adascale"
    lr_factor(rule, 1.0, 1.0)  # reject an unknown rule now, not at the first step
    original: Callable[..., Any] = optimizer.step

    # wraps() keeps the marker an LR scheduler sets on the method it wrapped.
    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        adaptive: AdaptiveBatch | None = getattr(loader, "adaptive", None)
        if adaptive is None:
            return original(*args, **kwargs)
        factor = current_factor(adaptive, rule)
        if factor == 1.0:
            return original(*args, **kwargs)
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * factor
        try:
            return original(*args, **kwargs)
        finally:
            for group, lr in zip(optimizer.param_groups, saved, strict=True):
                group["lr"] = lr

    optimizer.step = step  # type: ignore[method-assign]
    return optimizer
