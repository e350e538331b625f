"""AdaptDL's PyTorch API (``adaptdl.torch``) over tidal's runtime.

An AdaptDL script runs on tidal with its import changed::

    import tidal.compat.adaptdl as adl            # was: import adaptdl.torch as adl

    train_loader = adl.AdaptiveDataLoader(train_set, batch_size=64, shuffle=True)
    train_loader.autoscale_batch_size(1024, local_bsz_bounds=(32, 128))   # optional
    adl.init_process_group("gloo")
    model = adl.AdaptiveDataParallel(model, optimizer, scheduler)
    for epoch in adl.remaining_epochs_until(args.epochs):
        for x, y in train_loader: ...                # zero_grad, forward, backward, step
        stats = adl.Accumulator()
        for x, y in test_loader: stats["correct"] += ...
        with stats.synchronized(): print(stats["correct"])

Each name is a thin layer over the runtime, not a second runtime:
``AdaptiveDataLoader`` is an :class:`~tidal.ElasticDataLoader` (``batch_size`` is the
global batch, each worker iterates its share; ``autoscale_batch_size`` is tidal's adaptive
batch, with :func:`tidal.adaptive_lr` in place of AdaScale), ``AdaptiveDataParallel`` an
:class:`~tidal.ElasticDataParallel`, and ``remaining_epochs_until`` the epochs of a
:class:`tidal.State` holding the model, optimizer, scheduler, training loader and
accumulators. The state's step boundary is the end of each batch of the training loader:
there the job commits the step and changes size, so the workers a resize adds join in the
middle of an epoch, where AdaptDL restarts every worker from a checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tidal.compat.adaptdl_accumulator import Accumulator, book, position
from tidal.runtime.context import init
from tidal.runtime.data import ElasticDataLoader
from tidal.runtime.lr_scaling import adaptive_lr
from tidal.runtime.parallel import ElasticDataParallel
from tidal.runtime.state import State

__all__ = [
    "Accumulator",
    "AdaptiveDataLoader",
    "AdaptiveDataParallel",
    "current_dataloader",
    "current_epoch",
    "finished_epochs",
    "init_process_group",
    "remaining_epochs_until",
]

log = logging.getLogger("tidal.compat.adaptdl")

#: ``torch.utils.data.DataLoader`` arguments the loader takes as they are.
_LOADER_OPTIONS = {
    "drop_last",
    "collate_fn",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "worker_init_fn",
    "multiprocessing_context",
}


class AdaptiveDataLoader(ElasticDataLoader):
    """AdaptDL's ``AdaptiveDataLoader(dataset, batch_size=1, shuffle=False, **kwargs)``.

    ``batch_size`` is the job's batch, split over the workers; ``kwargs`` are
    ``DataLoader``'s (``drop_last``, ``collate_fn``, ``num_workers``, ``pin_memory``, ...);
    a custom ``sampler`` or ``batch_sampler`` is refused, as AdaptDL refuses it. Iterate it
    inside ``remaining_epochs_until``: the training loader resumes where the job is, any
    other starts its pass over the data afresh.
    """

    def __init__(
        self,
        dataset: Dataset[Any] | Sequence[Any],
        batch_size: int = 1,
        shuffle: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
            raise ValueError(
                "AdaptiveDataLoader does not support custom 'sampler' or 'batch_sampler'"
            )
        unknown = sorted(
            k for k in kwargs if k not in _LOADER_OPTIONS | {"sampler", "batch_sampler"}
        )
        if unknown:
            raise TypeError(
                f"AdaptiveDataLoader: unsupported argument(s) {', '.join(unknown)} "
                f"(it takes {', '.join(sorted(_LOADER_OPTIONS))})"
            )
        options = {k: v for k, v in kwargs.items() if k in _LOADER_OPTIONS}
        super().__init__(dataset, batch_size, shuffle=shuffle, **options)
        _job.loaders.append(self)

    def autoscale_batch_size(  # type: ignore[override]
        self,
        max_batch_size: int,
        local_bsz_bounds: tuple[int | None, int | None] | None = None,
        gradient_accumulation: bool = False,
    ) -> None:
        """Let the job choose its batch between ``batch_size`` and ``max_batch_size`` (each
        worker's share within ``local_bsz_bounds``), and make this the training loader."""
        if not isinstance(max_batch_size, int) or max_batch_size < self.batch_size:
            raise ValueError(
                f"max_batch_size: expected an integer >= batch_size ({self.batch_size}), "
                f"got {max_batch_size!r}"
            )
        low, high = local_bsz_bounds or (None, None)
        if (low is not None and low > self.batch_size) or (high is not None and high < 1):
            raise ValueError(f"local_bsz_bounds: invalid bounds {local_bsz_bounds!r}")
        bounds = (low or 1, high or max_batch_size)
        super().autoscale_batch_size(max_batch_size, bounds, gradient_accumulation)
        _job.training = self

    def __iter__(self) -> Iterator[Any]:
        if position.loader is not None:
            raise RuntimeError("overlapping dataloader iterations detected")
        state = _job.state
        training = state is not None and state.loader is self
        if not training:
            # A pass over other data (validation) has no steps: it runs whole each time.
            self.set_epoch(position.epoch if position.epoch is not None else self.epoch)
        position.loader = self
        try:
            while True:
                try:
                    batch = ElasticDataLoader.__next__(self)
                except StopIteration:
                    return
                yield batch
                if training:
                    assert state is not None
                    state.step()  # the body ran: commit, and change size if asked
        finally:
            position.loader = None

    @property
    def training(self) -> bool:
        """Whether this is the loader the job trains on (its batches are the steps)."""
        return _job.state is not None and _job.state.loader is self

    @property
    def current_batch_size(self) -> int | None:
        """The job's batch while this loader is iterated (``None`` otherwise)."""
        return self.batch_size if position.loader is self else None

    @property
    def current_local_bsz(self) -> int | None:
        """This worker's share of the last batch while this loader is iterated."""
        return len(self.last_indices) if position.loader is self else None

    @property
    def accumulation_steps(self) -> int:
        """Batches before an optimizer step, less one: a share is computed in one piece."""
        return 0


class AdaptiveDataParallel(ElasticDataParallel):
    """AdaptDL's ``AdaptiveDataParallel(model, optimizer, lr_scheduler=None,
    mp_scaler=None, scaling_rule=None, name=...)``: data parallelism whose world changes
    between steps. The model, optimizer, scheduler and scaler given are the job's state,
    kept across resizes and in checkpoints. ``scaling_rule`` is how the learning rate
    follows an autoscaled batch: ``"adascale"``, ``"adamscale"``, ``"sqrt"``, ``"linear"``
    or an object of AdaptDL's class of that name; by default AdamScale for Adam-like
    optimizers and AdaScale otherwise. Other keywords are ``DistributedDataParallel``'s.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any = None,
        mp_scaler: torch.amp.GradScaler | None = None,
        scaling_rule: Any = None,
        name: str = "adaptdl-dataparallel",
        **kwargs: Any,
    ) -> None:
        if _job.parallel is not None:
            raise RuntimeError("AdaptiveDataParallel: one per job (tidal trains one model)")
        super().__init__(model, **kwargs)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.mp_scaler = mp_scaler
        self.scaling_rule = _rule_name(scaling_rule)
        self.name = name
        _job.parallel = self


def _rule_name(rule: Any) -> str:
    if rule is None:
        return "auto"
    name = rule if isinstance(rule, str) else type(rule).__name__
    known = {"adascale": "adascale", "adamscale": "adamscale", "sqrt": "sqrt", "linear": "linear"}
    aliases = {"sqrtscale": "sqrt", "linearscale": "linear"}
    found = known.get(name.lower()) or aliases.get(name.lower())
    if found is None:
        raise ValueError(
            f"scaling_rule: expected adascale, adamscale, sqrt or linear (or AdaptDL's "
            f"AdaScale, AdamScale, SqrtScale, LinearScale), got {name!r}"
        )
    return found


class _Job:
    """What this process's AdaptDL calls have built, and the job's state once the epochs
    start (one job per process, as in AdaptDL)."""

    def __init__(self) -> None:
        self.loaders: list[AdaptiveDataLoader] = []
        self.training: AdaptiveDataLoader | None = None
        self.parallel: AdaptiveDataParallel | None = None
        self.state: State | None = None

    def ensure_state(self) -> State:
        """The job's state, built at the first epoch loop from what the script made."""
        if self.state is not None:
            return self.state
        parallel = self.parallel
        if parallel is None:
            raise RuntimeError(
                "remaining_epochs_until: build AdaptiveDataParallel(model, optimizer) first: "
                "it names the model and optimizer the job keeps across resizes"
            )
        loader = self.training or (self.loaders[0] if self.loaders else None)
        if loader is not None and loader.adaptive is not None:
            adaptive_lr(parallel.optimizer, loader, parallel.scaling_rule)
        self.state = State(
            model=parallel,
            optimizer=parallel.optimizer,
            loader=loader,
            scheduler=parallel.lr_scheduler,
            scaler=parallel.mp_scaler,
            accumulators=book,
        )
        self.state.before_switch.append(_fold_accumulators)
        parallel.optimizer.register_step_post_hook(_check_step_place)
        return self.state


_job = _Job()


def _fold_accumulators() -> None:
    try:
        book.fold_all()
    except (RuntimeError, OSError) as exc:  # a peer lost while summing: its share with it
        log.warning("accumulators: pending sums not gathered before the resize: %s", exc)


def _check_step_place(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """An optimizer step outside the training loader's loop would never be committed."""
    state = _job.state
    if state is None or (position.loader is not None and position.loader is state.loader):
        return
    where = (
        "outside any AdaptiveDataLoader loop"
        if position.loader is None
        else ("while iterating another AdaptiveDataLoader")
    )
    raise RuntimeError(
        f"optimizer.step() ran {where}: the job commits a step at each batch of its "
        "training loader (the one given autoscale_batch_size, else the first made); "
        "call autoscale_batch_size on the loader you train with"
    )


def init_process_group(
    backend: str,
    init_method: str | None = None,
    world_size: int | None = None,
    rank: int | None = None,
) -> None:
    """Join the job. tidal's launcher forms the groups (gloo, or NCCL on a GPU; the
    ``TIDAL_BACKEND`` variable overrides); ``init_method``, ``world_size`` and ``rank``
    are the launcher's business and are ignored with a warning."""
    if str(backend) not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
    given = {"init_method": init_method, "world_size": world_size, "rank": rank}
    ignored = [name for name, value in given.items() if value is not None]
    if ignored:
        log.warning("init_process_group: %s ignored: tidal forms the groups", ", ".join(ignored))
    context = init()
    if context.backend != backend:
        log.info("init_process_group: %s asked, the job runs %s", backend, context.backend)


def remaining_epochs_until(epoch: int) -> Iterator[int]:
    """The epochs from where the job is (after a resize or a restart from a checkpoint)
    up to ``epoch`` (exclusive); joins the job on first use."""
    if position.epoch is not None:
        raise RuntimeError("overlapping epoch loops detected")
    state = _job.ensure_state()
    for number in state.epochs(epoch):
        position.epoch = number
        try:
            yield number
        finally:
            position.epoch = None
            book.end_epoch(number)


def current_epoch() -> int | None:
    """The epoch being run inside ``remaining_epochs_until``, else ``None``."""
    return position.epoch


def finished_epochs() -> int:
    """The number of epochs the job has finished."""
    state = _job.state
    return state.epoch if state is not None else 0


def current_dataloader() -> AdaptiveDataLoader | None:
    """The loader being iterated, else ``None``."""
    loader: AdaptiveDataLoader | None = position.loader
    return loader
