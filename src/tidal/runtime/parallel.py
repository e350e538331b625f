"""Data parallelism that survives membership changes.

:class:`ElasticDataParallel` wraps the user's module and rebuilds a
``DistributedDataParallel`` for each generation's process group. Two things DDP's default
does not do, and how each generation does them (:func:`choose_gradient_sync`):

* the result is the gradient of the mean over the global batch even when the batch does
  not split evenly over the workers: DDP averages over the world, and a rank whose share
  is not ``1/W`` has its module output's gradient scaled by ``local · W / global``;
* every all-reduce goes through the context's failure guard, so a dead peer makes
  ``backward()`` return promptly (the step is then dropped and redone) instead of raising
  inside the user's loop or hanging until the timeout. On gloo, DDP runs over a
  :class:`~tidal.runtime.guarded_group.GuardedGroup`, whose all-reduce hands DDP the
  guard's future (``guarded``). On NCCL the guard has nothing to cut short (an NCCL
  all-reduce's future is complete once it is launched): DDP all-reduces over the
  generation's own group (``native``).

Either way DDP's C++ reducer does the work and a step's backward pass runs little or no
Python. The Python hook (``hook``: it weights each rank's bucket by ``n_r / B``, sums and
guards) is kept for what only it can do: read the gradient's statistics for the adaptive
batch size, and CUDA tensors on gloo.

Alone (a generation of one worker) there is nothing to all-reduce: the module runs
without DDP, as in a plain training loop, unless the adaptive batch size measures its
gradients (then DDP runs with the hook, which skips the collective).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tidal.runtime.batchnorm import GlobalBatchNorm, convert_batchnorm
from tidal.runtime.context import WorkerContext, current
from tidal.runtime.gradient_noise import GradientRecorder
from tidal.runtime.guarded_group import GuardedGroup
from tidal.runtime.sample_rng import per_sample_dropout

# Buffers are synchronised at membership changes only (the state broadcast). torch 2.13
# names the switch `forward_sync_buffers`; earlier releases call it `broadcast_buffers`.
_NO_BUFFER_SYNC = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)


def choose_gradient_sync(setting: str, backend: str, device: str, *, measuring: bool) -> str:
    """How a generation with peers all-reduces its gradients: ``native`` (DDP's own
    all-reduce over the generation's group), ``guarded`` (DDP's own all-reduce over a
    :class:`GuardedGroup`) or ``hook`` (the weighting, guarded Python hook).

    ``setting`` is ``TIDAL_GRADIENT_SYNC``. ``auto`` guards where a guard helps: on gloo,
    a survivor then stops waiting on a dead peer within one watcher poll; on ``nccl``
    nothing waits on the host, so DDP's group serves as it is. ``native`` on gloo gives up
    the guard (a lost peer then makes ``backward()`` raise) to save one Python call per
    bucket. ``device`` is the tensors' device type: the
    guarded group serves CPU tensors only, so gloo on GPUs takes the hook. ``measuring``:
    the adaptive batch size reads the gradient's statistics in the hook, so it is needed
    whatever the setting."""
    if measuring or setting == "hook":
        return "hook"
    if setting == "native" or (setting == "auto" and backend == "nccl"):
        return "native"
    return "guarded" if device == "cpu" and backend == "gloo" else "hook"


class _HookState:
    """Mutable per-step inputs of the gradient hook."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.weight = 1.0
        #: Gradient statistics of the adaptive batch size (``None``: not measured).
        self.recorder: GradientRecorder | None = None


def _weighted_allreduce(
    state: _HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    tensor = bucket.buffer()
    if state.context.failed:
        # The generation is broken: a new collective would only block a gloo thread
        # until the timeout. The step's optimizer update is skipped anyway.
        return _done(tensor)
    recorder = state.recorder
    if recorder is not None:
        # This rank's own gradient, before it is weighted and summed: with the reduced
        # one below, the gradient noise scale's estimator (no extra communication).
        recorder.before(bucket.index(), tensor)
    if state.weight != 1.0:
        tensor.mul_(state.weight)
    if state.context.world_size == 1:
        # Alone, the all-reduce is the identity: no collective, nothing to guard.
        return _done(recorder.after(tensor) if recorder is not None else tensor)
    group = state.context.group
    assert group is not None
    # The group's own all-reduce, not dist.all_reduce: its argument checks and logging
    # wrapper cost a small model's step more than the collective's launch. The guard
    # takes the tensor out of the work's result list itself (no `then` child future:
    # on a GPU each one records CUDA events and borrows streams).
    work = group.allreduce([tensor])
    if recorder is None:
        return state.context.guard(
            work.get_future(), lambda: tensor, device=tensor.device, pick=_first
        )
    future = work.get_future().then(lambda f: recorder.after(f.value()[0]))
    return state.context.guard(future, lambda: tensor, device=tensor.device)


def _done(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(tensor)
    return done


def _first(values: list[torch.Tensor]) -> torch.Tensor:
    return values[0]


# DDP checks a hook's annotations at runtime; postponed (string) annotations fail that check.
_weighted_allreduce.__annotations__ = {
    "state": _HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


class ElasticDataParallel(nn.Module):
    """``DistributedDataParallel`` whose world may change between steps.

    Use it like DDP: call it, then ``loss.backward()``. ``state_dict()`` is the wrapped
    module's, without DDP's ``module.`` prefix, so checkpoints load into a plain model.
    With ``sync_batchnorm=True`` every BatchNorm layer normalises with the statistics of
    the global batch (see :mod:`tidal.runtime.batchnorm`); with ``per_sample_rng=True``
    every dropout layer draws each sample's mask from the sample's position in the job's
    data (see :mod:`tidal.runtime.sample_rng`). With both, the result does not depend on
    the number of workers.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        sync_batchnorm: bool = False,
        per_sample_rng: bool = False,
        **ddp_options: Any,
    ) -> None:
        super().__init__()
        self._context = current()
        if sync_batchnorm:
            module = convert_batchnorm(module, self._context)
        if per_sample_rng:
            module = per_sample_dropout(module)
        self.module = module
        self._batchnorms = [m for m in module.modules() if isinstance(m, GlobalBatchNorm)]
        # Gradients as views of DDP's buckets: with a comm hook, DDP copies each gradient
        # into its bucket and the hook weights it in place (two passes over the gradients);
        # plain DDP divides while copying and copies back after the all-reduce (also two).
        # As views, nothing is copied back, so the weighting costs no extra pass.
        self._ddp_options = {
            _NO_BUFFER_SYNC: False,
            "gradient_as_bucket_view": True,
            **ddp_options,
        }
        self._hook_state = _HookState(self._context)
        self._ddp: DistributedDataParallel | None = None
        #: How the current DDP all-reduces (:func:`choose_gradient_sync`).
        self._sync: str | None = None
        #: Whether this generation runs the module without DDP (a world of one).
        self._alone = False
        #: This rank's share of the global batch as (local, global) samples.
        self._share = (1, 1)
        self._micro_weight = 1.0
        self._context.parallel = self
        if self._context.device.type == "cuda":
            self.module.to(self._context.device)

    def rebuild(self) -> None:
        """Bind to the context's current process group (called on each generation)."""
        self._ddp = None
        self._sync = None
        self._alone = False
        if not self._context.is_member:
            return
        measuring = self._hook_state.recorder is not None
        if self._context.world_size == 1 and not measuring:
            # DDP's wrapper and reducer cost a launch-bound GPU step ~0.2 ms over a plain
            # loop, for an all-reduce over one rank. The generation that admits a
            # newcomer builds DDP again.
            self._alone = True
            return
        sync = choose_gradient_sync(
            self._context.config.gradient_sync,
            self._context.backend,
            self._context.device.type,
            measuring=measuring,
        )
        group = self._context.group
        assert group is not None
        self._ddp = DistributedDataParallel(
            self.module,
            device_ids=[self._context.device.index]
            if self._context.device.type == "cuda"
            else None,
            process_group=GuardedGroup(group, self._context) if sync == "guarded" else group,
            init_sync=False,  # the state broadcast already made every rank equal
            **self._ddp_options,
        )
        self._sync = sync
        if sync == "hook":
            self._ddp.register_comm_hook(self._hook_state, _weighted_allreduce)

    @property
    def gradient_sync(self) -> str | None:
        """How this generation all-reduces gradients: ``native`` (DDP's own all-reduce),
        ``guarded`` (DDP's own all-reduce behind the failure guard), ``hook`` (the
        weighting, guarded Python hook), ``alone`` (a world of one: no DDP, nothing to
        all-reduce), ``None`` outside a group."""
        return "alone" if self._alone else self._sync

    def release(self) -> None:
        """Drop the DDP wrapper, so the old process group has no holder left."""
        ddp, self._ddp = self._ddp, None
        if ddp is not None and self._context.failed:
            # Its reducer holds the broken group, whose destructor waits for collectives
            # stuck on dead peers: never on this thread.
            self._context.release_after_failure(ddp)

    def set_batch_share(self, local: int, global_: int) -> None:
        """This rank computes ``local`` of the step's ``global_`` samples."""
        self._hook_state.weight = local / global_ if global_ else 0.0
        self._share = (local, global_)

    def set_recorder(self, recorder: GradientRecorder | None) -> None:
        """Measure gradient statistics in the hook (the adaptive batch size asks for it)."""
        self._hook_state.recorder = recorder
        if recorder is not None and self._sync != "hook":
            # The statistics are read in the hook, which a DDP registers before its first
            # backward only: rebuild it with the hook. Every rank of the generation does so
            # at the same step (the adaptive batch attaches at its first batch).
            self.rebuild()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module (through DDP when part of a group whose collectives
        work; once the generation broke, the step is dropped: it is computed locally)."""
        ddp = self._ddp
        if ddp is not None and not self._buckets_agreed(ddp):
            ddp = None
        # The statistics' gradient is weighted by the share where the hook weights the
        # parameters' (n_r / B, summed); where DDP averages, the output's gradient already
        # carries the share (below) and the plain sum over ranks is the global one.
        share = self._hook_state.weight if self._sync == "hook" else 1.0
        for layer in self._batchnorms:
            layer.share = share
        out = ddp(*args, **kwargs) if ddp is not None else self.module(*args, **kwargs)
        weight = self._micro_weight
        if ddp is not None and self._sync != "hook":
            # DDP averages over the world; the share weighting the hook would apply
            # (local / global per rank, summed) is that average of local·W / global.
            local, global_ = self._share
            world = self._context.world_size
            if global_ and local * world != global_:
                weight *= local * world / global_
        if weight != 1.0 and torch.is_grad_enabled():
            out = scale_output_gradients(out, weight)
        return out

    def _buckets_agreed(self, ddp: DistributedDataParallel) -> bool:
        """Whether ``ddp`` may run this forward: its group is not known broken, and the
        bucket order it settles on its second forward with a broadcast of its own (not
        routed through the hook's guard) is agreed. A peer dead at that moment made the
        broadcast raise out of the user's ``model(x)``, killing the survivor with it; here
        it breaks the generation instead, like any failed collective. Done before DDP's
        own forward, which then finds the buckets rebuilt (the call is a no-op then, and
        on the first forward, before backward has recorded an order)."""
        if self._context.failed:
            return False
        if not torch.is_grad_enabled():
            return True
        try:
            ddp.reducer._rebuild_buckets()
        except RuntimeError as exc:
            self._context.collective_failed(exc)
            return False
        return True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no all-reduce) inside this block."""
        if self._ddp is None:
            yield
        else:
            with self._ddp.no_sync():
                yield

    @contextlib.contextmanager
    def micro_batch(self, weight: float, *, sync: bool) -> Iterator[None]:
        """Run one micro-batch whose gradient counts ``weight`` of the local batch."""
        if self._batchnorms:
            # Ranks may split their shares into different numbers of micro-batches: their
            # statistics collectives would not pair up.
            raise ValueError(
                "micro_batch_size: gradient accumulation is not supported with "
                "sync_batchnorm=True (use a global batch that fits every worker)"
            )
        self._micro_weight = weight
        try:
            if sync:
                yield
            else:
                with self.no_sync():
                    yield
        finally:
            self._micro_weight = 1.0

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's state dict."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


def scale_output_gradients(out: Any, weight: float) -> Any:
    """Scale the gradient flowing back through every tensor of ``out`` by ``weight``;
    return ``out`` as it is.

    Scaling the output's gradient scales every parameter's gradient by the same factor
    (the chain rule is linear), which weights a micro-batch inside its local batch, or a
    rank's uneven share, without asking the user to rescale the loss. The hooks sit on the
    tensors themselves, so the containers holding them (tuples, named tuples, lists,
    mappings such as a model-output dict, dataclasses) are not rebuilt and keep their type;
    a tensor found twice is scaled once."""
    seen: set[int] = set()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.requires_grad and id(value) not in seen:
                seen.add(id(value))
                value.register_hook(lambda g: g * weight)  # type: ignore[no-untyped-call]
        elif isinstance(value, tuple | list):
            for item in value:
                visit(item)
        elif isinstance(value, Mapping):
            for item in value.values():
                visit(item)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name))

    visit(out)
    return out
