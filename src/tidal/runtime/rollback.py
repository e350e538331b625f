"""What a failed step changed, and how to take it back.

A step whose gradient sync broke is redone, so everything the step may have changed before
it committed must be put back as it was at the last step boundary. Two kinds of state:

* **large tensors** (parameters, optimizer moments): never copied. The runtime skips
  ``optimizer.step()`` while the step's gradient sync has failed, so they stay as
  committed;
* **everything else a step writes**: the optimizer's ``param_groups`` hyperparameters
  (``lr``, ``betas``, ``weight_decay`` ... that ``scheduler.step()`` or the adaptive learning
  rate write for the *next* step), the scheduler, the loader's position and adaptive batch
  state, torch's random number generators, :attr:`State.extras` and the extra stateful
  objects. These are small, so a :class:`StepSnapshot` copies them at every step boundary,
  with :func:`copy_state` (a structural copy that shares immutable values: several times
  cheaper than ``copy.deepcopy``, which the boundary paid on every step);
* **a mixed-precision ``GradScaler``**: its scale and growth tracker are device tensors,
  cloned on the device (:func:`scaler_state`): ``GradScaler.state_dict()`` would read the
  scale back to the host, a synchronisation with the GPU at every step.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from tidal.runtime.context import WorkerContext

_IMMUTABLE = (int, float, bool, str, bytes, complex, type(None))


def copy_state(value: Any) -> Any:
    """A copy of a ``state_dict``-like value that no later step can change: containers
    rebuilt, tensors cloned, immutable values shared (what ``copy.deepcopy`` would give,
    without its memo bookkeeping; other objects are deep-copied)."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {key: copy_state(item) for key, item in value.items()}
    if kind is list:
        return [copy_state(item) for item in value]
    if kind is tuple:
        return tuple(copy_state(item) for item in value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value)


def scaler_state(scaler: torch.amp.GradScaler) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The scaler's scale and growth tracker, cloned where they are (on the device): no
    host synchronisation. ``None`` for what it has not created yet (before its first
    ``scale()``, or ever when it is disabled)."""
    if not scaler.is_enabled():
        return None, None
    scale, tracker = scaler._scale, scaler._growth_tracker
    return (
        scale.detach().clone() if scale is not None else None,
        tracker.detach().clone() if tracker is not None else None,
    )


def restore_scaler(
    scaler: torch.amp.GradScaler, saved: tuple[torch.Tensor | None, torch.Tensor | None]
) -> None:
    """Put back what :func:`scaler_state` cloned (in place: a compiled step may hold the
    tensors). A scaler that had no scale yet gets none again, and creates it anew."""
    if not scaler.is_enabled():
        return
    scale, tracker = saved
    if scale is None or scaler._scale is None:
        scaler._scale = None if scale is None else scale.clone()
    else:
        scaler._scale.copy_(scale)
    if tracker is None or scaler._growth_tracker is None:
        scaler._growth_tracker = None if tracker is None else tracker.clone()
    else:
        scaler._growth_tracker.copy_(tracker)


#: Hyperparameter values shared rather than copied: immutable (a tuple such as Adam's
#: ``betas`` included, as ``param_groups`` hold them).
_SHARED = (*_IMMUTABLE, tuple)


def _copy_value(value: Any) -> Any:
    """A copy of one hyperparameter: scalars and tuples as they are, tensors cloned."""
    # An exact type lookup first: this runs for every key of every group at each step.
    if type(value) in _SHARED or isinstance(value, _SHARED):
        return value  # immutable: sharing is a copy
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value)


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Every ``param_groups`` entry but its parameters, copied."""
    return [
        {key: _copy_value(value) for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]


def restore_hyperparameters(optimizer: torch.optim.Optimizer, saved: list[dict[str, Any]]) -> None:
    """Put back what :func:`hyperparameters` copied (keys added since are removed)."""
    for group, values in zip(optimizer.param_groups, saved, strict=True):
        for key in [k for k in group if k != "params" and k not in values]:
            del group[key]
        for key, value in values.items():
            current = group.get(key)
            if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
                current.copy_(value)  # a tensor lr may be captured by a compiled step
            else:
                group[key] = _copy_value(value)


def rng_state() -> dict[str, Any]:
    """torch's generators' states (CPU, and CUDA once initialised): what dropout and the
    other random layers draw from. numpy's and Python's global generators are not taken:
    reading their state costs about a millisecond, several percent of a small step."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,  # type: ignore[no-untyped-call]
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def all_rng_state() -> dict[str, Any]:
    """torch's CPU generator, numpy's and Python's global ones: what a newcomer and a
    checkpoint carry (once per rescale or checkpoint, not per step)."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def restore_all_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`all_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class Stateful(Protocol):
    """Anything with ``state_dict`` / ``load_state_dict`` (modules, optimizers, schedulers)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


@dataclass
class StepSnapshot:
    """The small state of a :class:`~tidal.State` at a step boundary."""

    global_step: int
    epoch: int
    loader: dict[str, Any] | None
    scheduler: Any
    hyperparameters: list[dict[str, Any]] | None
    objects: dict[str, Any]
    extras: dict[str, Any]
    rng: dict[str, Any]
    scaler: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    @classmethod
    def take(
        cls,
        global_step: int,
        epoch: int,
        *,
        loader: Stateful | None,
        scheduler: Stateful | None,
        optimizer: torch.optim.Optimizer | None,
        objects: dict[str, Stateful],
        extras: dict[str, Any],
        scaler: torch.amp.GradScaler | None,
    ) -> StepSnapshot:
        """Copy what a failed step can change besides the model and the optimizer's
        tensors (which a failed step leaves alone: its ``optimizer.step()`` is skipped)."""
        return cls(
            global_step=global_step,
            epoch=epoch,
            loader=loader.state_dict() if loader is not None else None,
            scheduler=copy_state(scheduler.state_dict()) if scheduler is not None else None,
            hyperparameters=hyperparameters(optimizer) if optimizer is not None else None,
            objects={name: copy_state(o.state_dict()) for name, o in objects.items()},
            extras=copy_state(extras),
            rng=rng_state(),
            scaler=scaler_state(scaler) if scaler is not None else None,
        )

    def put_back(
        self,
        *,
        loader: Stateful | None,
        scheduler: Stateful | None,
        optimizer: torch.optim.Optimizer | None,
        objects: dict[str, Stateful],
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        """Put back into these objects, and torch's generators, what :meth:`take` copied
        (the step, the epoch and the extras are the caller's to take back)."""
        if loader is not None and self.loader is not None:
            loader.load_state_dict(self.loader)
        if scheduler is not None and self.scheduler is not None:
            scheduler.load_state_dict(copy_state(self.scheduler))
        if optimizer is not None and self.hyperparameters is not None:
            # scheduler.step() already wrote the next step's lr, betas ... into the groups;
            # the scheduler's own state does not hold them.
            restore_hyperparameters(optimizer, self.hyperparameters)
        for name, obj in objects.items():
            obj.load_state_dict(copy_state(self.objects[name]))
        if scaler is not None and self.scaler is not None:
            restore_scaler(scaler, self.scaler)
        restore_rng(self.rng)


def skip_failed_steps(
    optimizer: torch.optim.Optimizer, context: WorkerContext, on_step: Callable[[], None]
) -> None:
    """Make ``optimizer.step()`` a no-op while the step's gradient sync has failed, so
    the model and optimizer stay exactly as committed (no per-step copy needed).

    ``on_step`` is called when the step really runs. A failure found later in the same
    step (a peer died after the gradient sync completed here) must not undo it: the
    failure guard marks the context failed before it hands any collective a fallback
    value, so a step that starts while the context is healthy has the full gradient."""
    original = optimizer.step

    # wraps() keeps the marker an LR scheduler sets on the method it wrapped.
    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if context.failed:
            return None
        result = original(*args, **kwargs)
        on_step()
        return result

    optimizer.step = step  # type: ignore[method-assign]
