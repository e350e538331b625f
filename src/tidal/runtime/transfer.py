"""Broadcast a nested training state from one rank to all, from memory.

Tensors travel as one flat buffer per dtype (a handful of large collectives instead of one
per tensor); the structure and the non-tensor values travel once, pickled. Every collective
goes through the context's failure guard.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tidal.runtime.context import WorkerContext


@dataclass(frozen=True)
class _TensorRef:
    index: int


def _flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return _TensorRef(len(tensors) - 1)
    if isinstance(obj, dict):
        return {k: _flatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, tensors) for v in obj)
    return obj


def _unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


def _broadcast(tensor: torch.Tensor, src: int, context: WorkerContext) -> None:
    work = dist.broadcast(tensor, src, async_op=True)
    assert work is not None
    context.wait(work.get_future())


def broadcast_state(obj: Any, context: WorkerContext, src: int = 0) -> Any:
    """Return ``obj`` as held by rank ``src`` on every rank (``obj`` is ignored elsewhere).

    Raises :class:`tidal.runtime.context.PeerLost` if a peer dies meanwhile."""
    device = context.device
    tensors: list[torch.Tensor] = []
    if context.rank == src:
        skeleton = _flatten(obj, tensors)
        layout = [(t.dtype, tuple(t.shape), t.device.type) for t in tensors]
        header = pickle.dumps((skeleton, layout), protocol=pickle.HIGHEST_PROTOCOL)
        size = torch.tensor([len(header)], dtype=torch.long, device=device)
    else:
        size = torch.zeros(1, dtype=torch.long, device=device)
    _broadcast(size, src, context)
    if context.rank == src:
        raw = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device)
    else:
        raw = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _broadcast(raw, src, context)
    if context.rank != src:
        skeleton, layout = pickle.loads(raw.cpu().numpy().tobytes())

    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, (dtype, _shape, _dev) in enumerate(layout):
        by_dtype.setdefault(dtype, []).append(i)
    received: list[torch.Tensor | None] = [None] * len(layout)
    for dtype in sorted(by_dtype, key=str):
        members = by_dtype[dtype]
        numels = [_numel(layout[i][1]) for i in members]
        if context.rank == src:
            flat = torch.cat([tensors[i].reshape(-1).to(device) for i in members])
        else:
            flat = torch.empty(sum(numels), dtype=dtype, device=device)
        _broadcast(flat, src, context)
        if context.rank != src:
            for i, piece in zip(members, torch.split(flat, numels), strict=True):
                received[i] = piece.view(layout[i][1])
    if context.rank == src:
        return obj
    out = [t if t is not None else torch.empty(0) for t in received]
    out = [t.cpu() if layout[i][2] == "cpu" else t for i, t in enumerate(out)]
    return _unflatten(skeleton, out)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
