"""A training loop for users who do not want to write one.

In the spirit of ``FabricModel(model, datasets_fn, loss_fn, optimizer).train(...)``: give a
model, a way to build the datasets, a loss and an optimizer; :meth:`Trainer.fit` runs the
elastic loop (any number of workers, resizes, failures, checkpoints) and returns the
per-epoch history. The world size is the launcher's business (``tidal run --workers``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tidal.runtime.context import current
from tidal.runtime.data import ElasticDataLoader
from tidal.runtime.parallel import ElasticDataParallel
from tidal.runtime.state import State

log = logging.getLogger("tidal.trainer")

Batch = Any
Datasets = tuple[Dataset[Any], Dataset[Any] | None]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer, int], Any]
MetricsFn = Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]]


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Share of rows whose arg-max is the target (classification)."""
    return {"accuracy": (outputs.argmax(dim=1) == targets).float().mean().item()}


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` returns (complete on rank 0)."""

    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0

    @property
    def final(self) -> dict[str, float]:
        """The last epoch's figures."""
        return self.history[-1] if self.history else {}


class Trainer:
    """Elastic training without writing the loop.

    ``datasets`` builds ``(train, validation)`` (validation may be ``None``); it runs in
    every worker, so it must be deterministic. ``optimizer`` is a factory taking the
    parameters (``lambda p: torch.optim.SGD(p, lr=0.1)``); ``scheduler``, if given, takes
    the optimizer and the total number of steps. Batches are ``(inputs, targets)``.
    """

    def __init__(
        self,
        model: nn.Module,
        datasets: Callable[[], Datasets],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: OptimizerFactory,
        *,
        scheduler: SchedulerFactory | None = None,
        metrics: MetricsFn | None = accuracy,
        seed: int = 0,
    ) -> None:
        self.context = current()
        self.model = ElasticDataParallel(model)
        self.train_set, self.validation_set = datasets()
        self.loss_fn = loss_fn
        self.optimizer = optimizer(self.model.parameters())
        self._scheduler_factory = scheduler
        self.metrics = metrics
        self.seed = seed

    def fit(
        self,
        epochs: int,
        batch_size: int,
        *,
        micro_batch_size: int | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every_steps: int | None = None,
        on_epoch_end: Callable[[dict[str, float]], None] | None = None,
    ) -> FitResult:
        """Train for ``epochs`` with a global ``batch_size``; resumes wherever the job is."""
        loader = ElasticDataLoader(
            self.train_set, batch_size, seed=self.seed, micro_batch_size=micro_batch_size
        )
        scheduler = (
            self._scheduler_factory(self.optimizer, epochs * len(loader))
            if self._scheduler_factory
            else None
        )
        state = State(
            model=self.model,
            optimizer=self.optimizer,
            loader=loader,
            scheduler=scheduler,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every_steps=checkpoint_every_steps,
        )
        state.extras.setdefault("history", [])
        for epoch in state.epochs(epochs):
            total, count = 0.0, 0
            for batch in loader:
                self.optimizer.zero_grad()
                for inputs, targets in loader.micro_batches(batch):
                    loss = self.loss_fn(self.model(inputs), targets)
                    loss.backward()  # type: ignore[no-untyped-call]
                    total += loss.item() * len(targets)
                    count += len(targets)
                self.optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                state.step()
            row = {"epoch": float(epoch), "train_loss": total / max(count, 1)}
            row.update(self.evaluate())
            row["workers"] = float(self.context.world_size)
            state.extras["history"].append(row)
            if self.context.rank == 0:
                log.info("epoch %d %s", epoch, row)
            if on_epoch_end is not None:
                on_epoch_end(row)
        return FitResult(history=list(state.extras["history"]), steps=state.global_step)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss and metrics on the validation set (computed locally; all ranks agree)."""
        if self.validation_set is None:
            return {}
        module = self.model.module
        was_training = module.training
        module.eval()
        batch = list(torch.utils.data.DataLoader(self.validation_set, batch_size=4096))
        inputs = torch.cat([b[0] for b in batch]).to(self.context.device)
        targets = torch.cat([b[1] for b in batch]).to(self.context.device)
        outputs = module(inputs)
        row = {"val_loss": self.loss_fn(outputs, targets).item()}
        if self.metrics is not None:
            row.update({f"val_{k}": float(v) for k, v in self.metrics(outputs, targets).items()})
        module.train(was_training)
        return row
