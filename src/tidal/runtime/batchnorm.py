"""BatchNorm over the global batch, whatever the number of workers.

A BatchNorm layer normalises with the statistics of the batch it sees. Under data
parallelism each rank sees only its share, so plain BatchNorm makes the result depend on
how the global batch is split. :class:`GlobalBatchNorm` (what
``ElasticDataParallel(..., sync_batchnorm=True)`` puts in place of every ``BatchNorm*d``)
sums each rank's per-channel ``[sum(x), sum(x²), count]`` over the job's current process
group, so every rank normalises with the global batch's mean and (biased) variance and
updates its running statistics with them, exactly as one worker computing the whole batch.

Unlike ``torch.nn.SyncBatchNorm`` it captures no process group: each call uses the group
of the generation the worker is in, so it keeps working across rescales. Its collectives
go through the failure guard (a dead peer makes it fall back to local statistics at once;
the step is then dropped and redone), and its backward pass sums the statistics' gradient
over the ranks, weighted as the parameters' gradients are (see :class:`_SumOverRanks`), so
uneven shares give the gradient of the global batch's mean loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tidal.runtime.context import WorkerContext


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) of per-rank statistics, differentiable.

    The global loss is ``sum_r w_r L_r`` (``w_r = n_r / B``). Where the gradient hook
    multiplies each rank's parameter gradients by ``w_r`` after its backward pass
    (``weight`` is ``w_r``), the gradient reaching rank ``r``'s statistics must be
    ``sum_q w_q dL_q/dS`` divided by ``w_r``. Where DDP averages instead, each rank's
    output gradient is already scaled by ``w_r · W`` (``weight`` is 1): the plain sum of
    what reaches the ranks' statistics is ``W · sum_q w_q dL_q/dS``, which DDP's average
    divides by ``W``."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, context: WorkerContext, weight: float) -> Any:
        ctx.context, ctx.weight = context, weight
        return _all_reduce(local, context)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        weight = ctx.weight
        total = _all_reduce(grad * weight, ctx.context)
        return total / weight, None, None


def _all_reduce(tensor: torch.Tensor, context: WorkerContext) -> torch.Tensor:
    """The sum over the current group's ranks; this rank's own value if the generation
    broke (the step is then redone)."""
    out = tensor.clone()
    work = dist.all_reduce(out, async_op=True)
    assert work is not None
    future: torch.futures.Future[torch.Tensor] = work.get_future().then(lambda f: f.value()[0])
    reduced: torch.Tensor = context.guard(future, lambda: tensor, device=out.device).wait()
    return reduced


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``BatchNorm{1,2,3}d`` whose training statistics are those of the global batch."""

    def __init__(self, num_features: int, context: WorkerContext, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        self._context = context
        #: The weight of this rank's statistics' gradient (:class:`_SumOverRanks`): its
        #: share of the global batch under the gradient hook, else 1 (set by
        #: ElasticDataParallel before each forward).
        self.share = 1.0

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"input: expected at least 2 dimensions, got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise ``input`` (``N, C, ...``) with the global batch's statistics."""
        context = self._context
        if not self.training or not (context.is_member and context.world_size > 1):
            plain: torch.Tensor = super().forward(input)
            return plain
        dims = [0, *range(2, input.dim())]
        count = input.numel() // input.shape[1]
        local = torch.stack(
            [input.sum(dims), (input * input).sum(dims), input.new_full((input.shape[1],), count)]
        ).to(torch.float64)
        total: torch.Tensor = _SumOverRanks.apply(local, context, self.share)  # type: ignore[no-untyped-call]
        n = total[2, 0].detach()
        mean = total[0] / n
        var = (total[1] / n - mean * mean).clamp_min(0.0)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running(mean.detach(), var.detach(), float(n.item()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        scale = torch.rsqrt(var + self.eps).to(input.dtype)
        out = (input - mean.to(input.dtype).view(shape)) * scale.view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average
            factor = 1.0 / float(self.num_batches_tracked.item())
        else:
            factor = self.momentum
        unbiased = var * (n / (n - 1)) if n > 1 else var
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def convert_batchnorm(module: nn.Module, context: WorkerContext) -> nn.Module:
    """``module`` with every ``BatchNorm1d/2d/3d`` replaced by a :class:`GlobalBatchNorm`
    holding the same parameters and running statistics (in place where possible)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, GlobalBatchNorm
    ):
        converted = GlobalBatchNorm(
            module.num_features,
            context,
            eps=module.eps,
            momentum=module.momentum,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
            device=_device_of(module),
            dtype=_dtype_of(module),
        )
        with torch.no_grad():
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            if module.track_running_stats:
                converted.running_mean = module.running_mean
                converted.running_var = module.running_var
                converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        module.add_module(name, convert_batchnorm(child, context))
    return module


def _device_of(module: nn.Module) -> torch.device | None:
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return None


def _dtype_of(module: nn.Module) -> torch.dtype | None:
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_floating_point():
            return tensor.dtype
    return None
