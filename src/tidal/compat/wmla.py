"""IBM WMLA's elastic distributed training, as its scripts call it, over ``tidal.Trainer``.

A script written for WMLA's Elastic Distributed Training builds a ``FabricModel`` and calls
``train``; its hyperparameters come from the training form through the parameter readers::

    from tidal.compat.wmla import FabricModel, getEpoch, getOptimizer, getTrainBatchSize

    model = Net()
    fabric = FabricModel(model, get_datasets, F.cross_entropy, getOptimizer(model))
    fabric.train(getEpoch(), getTrainBatchSize(), engines_number=4)

Nothing here is a second runtime: ``FabricModel`` is :class:`tidal.Trainer` (elastic data
parallelism, resizes at step boundaries, rollback of a failed step, checkpoints), and the
readers are :func:`tidal.params` under WMLA's names. ``engines_number`` is WMLA's maximum
number of workers: in tidal the job's elastic range says it (``tidal run --workers
1:N``, ``tidal submit --max-workers N``, ``tidal train --workers 1:N``), since the
scheduler, not the script, decides the size; ``train`` logs a warning when the job runs
more workers than the script asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from tidal.runtime.job_params import ParamsError, params
from tidal.runtime.trainer import Datasets, FitResult, MetricsFn, Trainer, accuracy

__all__ = [
    "FabricModel",
    "getEpoch",
    "getLearningRate",
    "getOptimizer",
    "getTrainBatchSize",
    "getTrainData",
]

log = logging.getLogger("tidal.compat.wmla")

#: The form's parameter names the readers look up (the first one given wins).
EPOCHS = ("epochs", "epoch")
BATCH_SIZE = ("batch_size", "train_batch_size")
LEARNING_RATE = ("lr", "learning_rate")
OPTIMIZER = "optimizer"
#: Optimizer options taken from the form when it gives them.
OPTIMIZER_OPTIONS = ("momentum", "weight_decay", "nesterov", "betas", "eps")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Optimizer = torch.optim.Optimizer | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class FabricModel:
    """WMLA's ``FabricModel(model, get_datasets, loss_fn, optimizer)``.

    ``get_datasets()`` returns ``(train, test)`` datasets of ``(inputs, targets)`` (``test``
    may be ``None``); it runs in every worker, so it must give the same data everywhere.
    ``optimizer`` is an optimizer built on ``model``'s parameters, as WMLA takes it, or a
    factory taking the parameters. ``metrics`` computes validation figures from outputs and
    targets (accuracy by default).
    """

    def __init__(
        self,
        model: nn.Module,
        get_datasets: Callable[[], Datasets],
        loss_fn: LossFn,
        optimizer: Optimizer,
        *,
        metrics: MetricsFn | None = accuracy,
        seed: int = 0,
    ) -> None:
        factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
        if isinstance(optimizer, torch.optim.Optimizer):
            _check_optimizer_holds(model, optimizer)
            factory = _given(optimizer)
        elif callable(optimizer):
            factory = optimizer
        else:
            raise TypeError(
                "optimizer: expected a torch optimizer built on the model's parameters or a "
                f"function taking the parameters, got {type(optimizer).__name__}"
            )
        self.trainer = Trainer(model, get_datasets, loss_fn, factory, metrics=metrics, seed=seed)

    @property
    def model(self) -> nn.Module:
        """The trained module (without the data-parallel wrapper)."""
        return self.trainer.model.module

    def train(
        self,
        epochs: int,
        batch_size: int,
        engines_number: int | None = None,
        *,
        checkpoint_dir: str | None = None,
        on_epoch_end: Callable[[dict[str, float]], None] | None = None,
    ) -> FitResult:
        """Train ``epochs`` epochs with a global batch of ``batch_size`` samples, on at most
        ``engines_number`` workers (the job's maximum: see the module's notes); resumes
        wherever the job is, and returns the per-epoch history."""
        _check_count("epochs", epochs, 1)
        _check_count("batch_size", batch_size, 1)
        if engines_number is not None:
            _check_count("engines_number", engines_number, 1)
        warned = False

        def epoch_end(row: dict[str, float]) -> None:
            nonlocal warned
            workers = int(row.get("workers", 1))
            if engines_number is not None and workers > engines_number and not warned:
                warned = True
                log.warning(
                    "the job runs %d workers, more than engines_number=%d: set the job's "
                    "maximum (--workers 1:%d) to hold it there",
                    workers,
                    engines_number,
                    engines_number,
                )
            if on_epoch_end is not None:
                on_epoch_end(row)

        return self.trainer.fit(
            epochs, batch_size, checkpoint_dir=checkpoint_dir, on_epoch_end=epoch_end
        )


def _given(
    optimizer: torch.optim.Optimizer,
) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    """The optimizer the script built, as the factory the trainer takes."""

    def factory(_: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return optimizer

    return factory


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _check_optimizer_holds(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """An optimizer built on another model's parameters would train nothing here."""
    ours = {id(p) for p in model.parameters()}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not held & ours:
        raise ValueError("optimizer: it holds none of the model's parameters")


def _first(names: tuple[str, ...], default: Any) -> Any:
    """The first of ``names`` the job gives, typed as ``default``; else ``default``."""
    given = params()  # without defaults: only what the job gives
    for name in names:
        if name in given:
            return params(**{name: default})[name]
    return default


# WMLA's names, in its camel case, so its scripts run unchanged.


def getTrainData(default: str | None = None) -> str:
    """The training data's location: the registered dataset the job trains on
    (``TIDAL_DATASET``), else ``default``."""
    location = params(dataset=default).dataset
    if location is None:
        raise ParamsError(
            "TIDAL_DATASET: the job names no dataset and the script gives no default "
            "(getTrainData(default=...))"
        )
    return location


def getEpoch(default: int = 1) -> int:
    """The number of epochs the form asks for (``epochs``), else ``default``."""
    return int(_first(EPOCHS, default))


def getTrainBatchSize(default: int = 64) -> int:
    """The global batch size the form asks for (``batch_size``), else ``default``."""
    return int(_first(BATCH_SIZE, default))


def getLearningRate(default: float = 0.01) -> float:
    """The learning rate the form asks for (``lr`` or ``learning_rate``), else ``default``."""
    return float(_first(LEARNING_RATE, float(default)))


def getOptimizer(
    model: nn.Module | Iterable[nn.Parameter], default: str = "SGD", lr: float = 0.01
) -> torch.optim.Optimizer:
    """An optimizer over ``model``'s parameters, of the kind the form names (``optimizer``:
    ``SGD``, ``Adam``, ``AdamW``, ... any of ``torch.optim``, in any case) with its learning
    rate (``lr``) and the options it gives (``momentum``, ``weight_decay``, ``nesterov``,
    ``betas``, ``eps``); else ``default`` at ``lr``."""
    name = str(params(**{OPTIMIZER: default})[OPTIMIZER])
    known = {
        n.lower(): cls
        for n, cls in vars(torch.optim).items()
        if isinstance(cls, type)
        and issubclass(cls, torch.optim.Optimizer)
        and cls is not torch.optim.Optimizer
    }
    cls = known.get(name.lower())
    if cls is None:
        raise ParamsError(
            f"TIDAL_PARAMS: {OPTIMIZER}: unknown optimizer {name!r} "
            f"(expected one of {', '.join(sorted(c.__name__ for c in known.values()))})"
        )
    given = params()
    options: dict[str, Any] = {k: given[k] for k in OPTIMIZER_OPTIONS if k in given}
    options["lr"] = getLearningRate(lr)
    parameters = model.parameters() if isinstance(model, nn.Module) else model
    try:
        optimizer: torch.optim.Optimizer = cls(parameters, **options)
    except (TypeError, ValueError) as exc:
        raise ParamsError(
            f"TIDAL_PARAMS: {OPTIMIZER}: {cls.__name__} refused {options}: {exc}"
        ) from None
    return optimizer
