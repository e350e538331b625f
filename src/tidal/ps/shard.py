"""How a model's parameters are split over the servers: contiguous byte ranges.

All parameters, flattened and laid end to end in ``named_parameters()`` order, form one
byte sequence; server ``i`` owns the ``i``-th of ``n_ps`` equal byte ranges, cut at element
boundaries. A tensor that straddles a cut is split into pieces, so two servers get the same
number of bytes however unequal the tensors are (a 6.3M-parameter MLP is 90% one matrix;
round-robin of whole tensors would put nearly all of it on one server). Workers and servers
compute the layout independently from the same model; its digest makes a mismatch an error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, stop)`` of the flattened parameter number ``param``."""

    param: int
    start: int
    stop: int
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)


@dataclass(frozen=True)
class ShardLayout:
    """The pieces of every server, in shard order."""

    shards: tuple[tuple[Piece, ...], ...]
    digest: str

    def nbytes(self, shard: int) -> int:
        """Bytes owned by ``shard``."""
        return sum(p.nbytes for p in self.shards[shard])


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def plan_shards(params: Sequence[tuple[str, torch.Size, torch.dtype]], n_ps: int) -> ShardLayout:
    """Split ``(name, shape, dtype)`` parameters into ``n_ps`` byte-balanced shards."""
    if n_ps < 1:
        raise ValueError(f"n_ps: expected at least 1 server, got {n_ps}")
    sizes = [(int(torch.Size(shape).numel()), _itemsize(dtype)) for _, shape, dtype in params]
    total = sum(n * s for n, s in sizes)
    cuts = [total * i // n_ps for i in range(1, n_ps)] + [total]
    shards: list[list[Piece]] = [[] for _ in range(n_ps)]
    shard, offset = 0, 0  # offset: bytes before the current element
    for i, ((numel, item), (_, _, dtype)) in enumerate(zip(sizes, params, strict=True)):
        start = 0
        while start < numel:
            while shard < n_ps - 1 and offset >= cuts[shard]:
                shard += 1
            # elements of this tensor that fit before the shard's cut (at least one)
            room = max(1, -(-(cuts[shard] - offset) // item))
            stop = min(numel, start + room)
            shards[shard].append(Piece(i, start, stop, dtype))
            offset += (stop - start) * item
            start = stop
    text = repr([(name, tuple(shape), str(dtype)) for name, shape, dtype in params]) + f"/{n_ps}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return ShardLayout(tuple(tuple(s) for s in shards), digest)


def layout_of(model: torch.nn.Module, n_ps: int) -> ShardLayout:
    """The layout of ``model``'s trainable parameters over ``n_ps`` servers."""
    return plan_shards(
        [(n, p.shape, p.dtype) for n, p in model.named_parameters() if p.requires_grad], n_ps
    )


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters a layout covers, in its order."""
    return [p for p in model.parameters() if p.requires_grad]


def piece_view(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The 1-D view of ``tensor``'s elements that ``piece`` names (no copy)."""
    return tensor.detach().view(-1)[piece.start : piece.stop]
