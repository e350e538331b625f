"""A plain DDP script written for torchrun: no tidal anywhere.

It reads its place from torchrun's environment (``init_process_group`` with ``env://``),
trains a small MLP on scikit-learn's digits under ``DistributedDataParallel`` (gloo) and
keeps its own checkpoint (model, optimizer, step), written by rank 0 after every step
(write, then rename: a file is whole or absent) and read by every rank at start. So a run
stopped at any point resumes where its last checkpoint was, whatever its new world size.

Each step takes the next ``--batch-size`` samples of the epoch's seeded permutation of the
training set; rank ``r`` of ``w`` computes a contiguous share. Rank 0 prints one line per
step, the step it resumed at (with ``TORCHELASTIC_RESTART_COUNT``) and, at the end, the
held-out accuracy; ``--trace FILE`` also appends one JSON line per step to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel

TRAIN = 1500  # of 1797 digits; the rest is held out


def share(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a global batch that ``rank`` of ``world`` computes."""
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="total steps of the run")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep in each step")
    parser.add_argument("--trace", help="append one JSON line per step (rank 0) here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")

    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    data, labels = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    train_x, train_y = data[:TRAIN], labels[:TRAIN]
    test_x, test_y = data[TRAIN:], labels[TRAIN:]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    ckpt = Path(args.checkpoint)
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        if rank == 0:
            print(
                f"resumed at step {step} from {ckpt.name}: world {world}, "
                f"TORCHELASTIC_RESTART_COUNT={restart}",
                flush=True,
            )
    elif rank == 0:
        print(f"fresh start: world {world}, TORCHELASTIC_RESTART_COUNT={restart}", flush=True)
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = TRAIN // args.batch_size
    trace = open(args.trace, "a", buffering=1) if args.trace and rank == 0 else None  # noqa: SIM115

    while step < args.steps:
        epoch, position = divmod(step, per_epoch)
        order = torch.randperm(TRAIN, generator=torch.Generator().manual_seed(1000 + epoch))
        batch = order[position * args.batch_size : (position + 1) * args.batch_size]
        lo, hi = share(len(batch), world, rank)
        mine = batch[lo:hi]
        optimizer.zero_grad()
        loss = loss_fn(ddp(train_x[mine]), train_y[mine])
        loss.backward()
        optimizer.step()
        step += 1
        if args.step_delay:
            time.sleep(args.step_delay)
        if rank == 0:
            tmp = ckpt.with_name(f".{ckpt.name}.tmp")
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                tmp,
            )
            os.replace(tmp, ckpt)
            now = time.time()
            print(f"step {step} world {world} loss {loss.item():.4f}", flush=True)
            if trace is not None:
                line = {"step": step, "world": world, "t": now, "pid": os.getpid(), "rank": 0}
                trace.write(json.dumps(line) + "\n")

    if rank == 0:
        with torch.no_grad():
            logits = model(test_x)
            accuracy = (logits.argmax(1) == test_y).float().mean().item()
            test_loss = loss_fn(logits, test_y).item()
        print(
            f"finished at step {step}: held-out accuracy {accuracy:.3f} loss {test_loss:.4f}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
