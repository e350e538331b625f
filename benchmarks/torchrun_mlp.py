"""The baseline: ``examples/synthetic_mlp.py``'s model and data under plain DDP (gloo).

Launched by ``torchrun`` (one process per rank; ``RANK``/``WORLD_SIZE``/``MASTER_*`` from
its environment). Each step takes the next global batch of the epoch's seeded permutation
and gives rank ``r`` its contiguous share (the same sharding as tidal's loader), runs
forward/backward under ``DistributedDataParallel`` and steps the optimizer.

With ``--checkpoint DIR`` rank 0 saves model, optimizer and step after every step
(atomically: write then rename) and every process resumes from it at start, which is how a
torchrun job survives its restarts. ``--trace DIR`` writes the same JSON lines as the
example (``DIR/<pid>.jsonl``), after the checkpoint is saved.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from synthetic_mlp import Trace, build_data, build_model


def shard_bounds(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a ``batch`` that ``rank`` of ``world`` computes."""
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def save_atomic(state: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=float, default=6.3e6)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=96, help="global batch size")
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="gloo collective timeout")
    parser.add_argument("--checkpoint", help="directory: save every step, resume at start")
    parser.add_argument("--trace", help="directory for per-process JSON-lines step traces")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args.params, args.layers, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = build_data(args.samples, args.seed)
    step = 0
    ckpt = Path(args.checkpoint) / "latest.pt" if args.checkpoint else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    ddp = DistributedDataParallel(model)
    trace = Trace(args.trace, str(os.getpid()))
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = args.samples // args.batch_size
    order_epoch, order = -1, torch.empty(0, dtype=torch.long)

    while step < args.steps:
        epoch, position = divmod(step, per_epoch)
        if epoch != order_epoch:
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + epoch)
            order, order_epoch = torch.randperm(args.samples, generator=g), epoch
        lo, hi = shard_bounds(args.batch_size, world, rank)
        start = position * args.batch_size
        x, y = data[order[start + lo : start + hi]]
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if ckpt is not None and rank == 0:
            save_atomic(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                ckpt,
            )
        trace.write(
            step=step,
            t=time.time(),
            cpu=time.process_time(),
            world=world,
            rank=rank,
            pid=os.getpid(),
        )
        if rank == 0 and step % 20 == 0:
            print(f"step {step} world {world} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
