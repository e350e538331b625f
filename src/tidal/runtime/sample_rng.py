"""Random numbers keyed by sample, so that dropout does not depend on the worker count.

Under data parallelism each rank draws dropout masks from its own generator, so which
sample gets which mask depends on how the global batch is split over the workers. Here
the random numbers for a sample are a pure function of where that sample sits in the
job's data — ``(loader seed, epoch, position in the epoch's order)`` — and of which random
op asks (a stream number per layer and a call count within the step), computed with a
counter-based hash (splitmix64) in int64 tensor arithmetic. So:

* a sample gets the same mask alone or on any number of workers, with any split;
* a rolled-back step, redone on another world, draws the same masks (the loader's position
  is rolled back, and the call counts start again with the redone batch);
* newcomers need nothing sent: the loader's state, which they receive, is the whole key.

The loader publishes the current batch's :class:`~tidal.runtime.sample_span.SampleSpan` on
the worker's context at every batch (and every micro-batch); :class:`PerSampleDropout` and
:func:`sample_rand_like` read it there.
"""

from __future__ import annotations

import torch
from torch import nn

from tidal.runtime.context import current
from tidal.runtime.sample_span import SampleSpan

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _mix_int(value: int) -> int:
    """splitmix64's finaliser on a Python int (64-bit arithmetic)."""
    value &= _MASK64
    value = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX2) & _MASK64
    return value ^ (value >> 31)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2**64)."""
    x = x ^ _shift_right(x, 30)
    x = x * _signed(_MIX1)
    x = x ^ _shift_right(x, 27)
    x = x * _signed(_MIX2)
    return x ^ _shift_right(x, 31)


def stream_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, stream, call ...), as torch's int64."""
    key = 0
    for part in parts:
        key = _mix_int(key ^ ((part * _GOLDEN) & _MASK64) ^ _GOLDEN)
    return _signed(key)


def uniform(
    key: int, positions: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """Uniform numbers in ``[0, 1)`` of shape ``(len(positions), *shape)``: row ``j``
    depends only on ``key``, ``positions[j]`` and the element's index in ``shape``."""
    per_sample = 1
    for size in shape:
        per_sample *= size
    rows = _mix(positions.to(torch.long) * _signed(_GOLDEN) + key)
    elements = torch.arange(1, per_sample + 1, dtype=torch.long, device=positions.device)
    bits = _mix(rows[:, None] + elements[None, :] * _signed(_MIX2))
    # The top 53 bits: exact in float64, evenly spaced in [0, 1).
    values = _shift_right(bits, 11).to(torch.float64) * 2.0**-53
    return values.to(dtype).reshape(len(positions), *shape)


def current_span() -> SampleSpan:
    """The span of the batch this rank is computing (set by ``ElasticDataLoader``)."""
    span = current().sample_span
    if span is None:
        raise RuntimeError(
            "per-sample random numbers need the batch to come from a tidal.ElasticDataLoader "
            "(no batch has been drawn from one yet)"
        )
    return span


def sample_rand_like(like: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniform numbers in ``[0, 1)`` shaped like ``like`` (batch first), whose row ``j``
    depends only on the position of the batch's sample ``j`` in the job's data and on
    ``stream``: the same on any number of workers. Use a distinct ``stream`` for each
    random op in a step (the same stream gives the same numbers again)."""
    span = current_span()
    _check_batch(like, span)
    key = stream_key(span.seed, span.epoch, stream, 0)
    positions = torch.arange(span.start, span.start + span.count, device=like.device)
    dtype = like.dtype if like.is_floating_point() else torch.float64
    return uniform(key, positions, tuple(like.shape[1:]), dtype)


def _check_batch(like: torch.Tensor, span: SampleSpan) -> None:
    if like.dim() == 0 or like.shape[0] != span.count:
        raise ValueError(
            f"per-sample random numbers: expected a batch-first tensor of {span.count} "
            f"samples (this rank's share of the batch), got shape {tuple(like.shape)}"
        )


class PerSampleDropout(nn.Module):
    """Dropout whose mask for a sample depends only on the sample's position in the job's
    data, the layer and the call: the same on any number of workers (see module doc).
    ``channelwise`` drops whole channels (``Dropout1d/2d/3d``: inputs ``N, C, ...``)."""

    def __init__(self, p: float, stream: int, *, channelwise: bool = False, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p: expected a probability in [0, 1], got {p!r}")
        self.p = p
        self.stream = stream
        self.channelwise = channelwise
        self.seed = seed
        self._serial = -1
        self._calls = 0

    def extra_repr(self) -> str:
        return f"p={self.p}, stream={self.stream}, channelwise={self.channelwise}"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Zero each element (or channel) with probability ``p``, scale the rest by
        ``1 / (1 - p)``; identity in eval mode."""
        if not self.training or self.p == 0.0:
            return input
        span = current_span()
        _check_batch(input, span)
        if span.serial != self._serial:
            # A new batch (or the redo of a rolled-back one): count calls from zero, so a
            # layer applied twice in one forward draws two masks, the same ones each time.
            self._serial, self._calls = span.serial, 0
        call, self._calls = self._calls, self._calls + 1
        if self.p == 1.0:
            return input * 0.0
        if self.channelwise:
            if input.dim() < 3:
                raise ValueError(
                    f"channel dropout: expected input (N, C, ...), got shape {tuple(input.shape)}"
                )
            shape: tuple[int, ...] = (input.shape[1],) + (1,) * (input.dim() - 2)
        else:
            shape = tuple(input.shape[1:])
        key = stream_key(self.seed, span.seed, span.epoch, self.stream, call)
        positions = torch.arange(span.start, span.start + span.count, device=input.device)
        keep = uniform(key, positions, shape, torch.float64) >= self.p
        return input * (keep.to(input.dtype) / (1.0 - self.p))


_CHANNELWISE = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)


def per_sample_dropout(module: nn.Module, *, seed: int = 0) -> nn.Module:
    """``module`` with every ``nn.Dropout`` / ``Dropout1d/2d/3d`` replaced by a
    :class:`PerSampleDropout` (streams numbered in ``module.modules()`` order, the same on
    every rank), in place. ``seed`` varies the masks between otherwise equal jobs.
    ``AlphaDropout`` and functional ``F.dropout`` calls are left as they are."""
    replaced: dict[int, PerSampleDropout] = {}

    def convert(node: nn.Module) -> nn.Module:
        if isinstance(node, (nn.Dropout, *_CHANNELWISE)):
            if id(node) not in replaced:  # a layer used at two places stays one layer
                layer = PerSampleDropout(
                    node.p, len(replaced), channelwise=isinstance(node, _CHANNELWISE), seed=seed
                )
                layer.train(node.training)
                replaced[id(node)] = layer
            return replaced[id(node)]
        # Not named_children(): it lists a shared child once, and its other place
        # would keep the plain layer.
        for name, child in list(node._modules.items()):
            if child is not None:
                node.add_module(name, convert(child))
        return node

    return convert(module)
