"""Training script driven by the runtime tests: digits, an MLP, and an audit trail.

Every step appends one JSON line per rank to ``OUT/steps-<worker>.jsonl``: the
generation and world it ran in, the dataset indices it consumed and a checksum of the
parameters after the step. Rank 0 writes the final parameters to ``OUT/final.pt``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import tidal


def _process_start() -> float:
    """When this process started (wall clock), from /proc; ``nan`` where there is none."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    # /proc/uptime, not btime: btime is whole seconds, uptime hundredths.
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


#: Benchmarks read it beside each step's time: process start → first step is a cold start.
STARTED = _process_start()


class NumberedSamples(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """The digits sample by sample, each with its index: what a batch holds can be checked
    against what the loader says it consumed."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def hold_for_size(ctx: tidal.WorkerContext, size: int, timeout: float = 120.0) -> None:
    """Unless the world has ``size`` workers, wait for the launcher to publish a generation
    newer than ours (then train on: it is joined at the next boundary, so intermediate
    sizes never deadlock)."""
    assert ctx.generation is not None
    if ctx.world_size == size:
        return
    current = ctx.generation.number
    deadline = time.monotonic() + timeout
    while True:
        latest = ctx.rendezvous.latest()
        if latest is not None and latest.number > current:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no generation after {current} within {timeout} s")
        time.sleep(0.01)


def _wait_for_failure(ctx: tidal.WorkerContext, timeout: float = 10.0) -> None:
    """Wait (bounded) until this worker knows that its generation broke."""
    deadline = time.monotonic() + timeout
    while not ctx.failed and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep inside each step")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="read the samples one by one in this many persistent loader worker processes "
        "(each batch then carries its sample indices, logged as batch_ids)",
    )
    parser.add_argument(
        "--rank1-dies-after-step",
        type=int,
        default=0,
        help="rank 1 SIGKILLs itself right after this step's optimizer step; the other "
        "ranks hold that step's boundary until they have noticed",
    )
    parser.add_argument(
        "--rank1-dies-before-step",
        type=int,
        default=0,
        help="in the first generation, rank 1 SIGKILLs itself before this step's forward; "
        "the other ranks reach theirs once it is gone (step 2: DDP's bucket rebuild)",
    )
    parser.add_argument(
        "--rank1-dies-in-backward",
        type=int,
        default=0,
        help="in the first generation, rank 1 SIGKILLs itself 1 s after this step's forward, "
        "while the other ranks wait for its gradients in the all-reduce",
    )
    parser.add_argument(
        "--rank0-misses-the-step",
        action="store_true",
        help="with --rank1-dies-after-step: rank 0 hears of the failure before its optimizer "
        "step (and skips it, as a rank whose gradient sync failed), while rank 2 commits it",
    )
    parser.add_argument(
        "--hold-at",
        default="",
        help="STEP:N[,STEP:N...]: after STEP, wait (bounded) until the launcher has published "
        "a generation of N workers, so that scripted resizes land however fast steps run",
    )
    args = parser.parse_args()
    holds = dict(
        (int(step), int(n))
        for step, n in (item.split(":") for item in args.hold_at.split(",") if item)
    )

    dtype = getattr(torch, args.dtype)
    ctx = tidal.init()
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    inputs, targets = torch.tensor(x, dtype=dtype), torch.tensor(y)
    data: Dataset[Any] = TensorDataset(inputs, targets)
    workers: dict[str, Any] = {}
    if args.num_workers:
        data = NumberedSamples(inputs, targets)
        workers = {"num_workers": args.num_workers, "persistent_workers": True}
    torch.manual_seed(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).to(dtype)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.7)
    loader = tidal.ElasticDataLoader(
        data,
        batch_size=args.batch_size,
        seed=1,
        micro_batch_size=args.micro_batch_size,
        **workers,
    )
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    loss_fn = nn.CrossEntropyLoss()
    log = open(os.path.join(args.out, f"steps-{ctx.worker_id}.jsonl"), "a", buffering=1)  # noqa: SIM115

    for _epoch in state.epochs(args.epochs):
        for batch in loader:
            epoch, indices = loader.epoch, loader.last_indices
            batch_ids = None
            if args.num_workers:
                batch_ids = batch[2].tolist()
                batch = (batch[0], batch[1])
            everyone = loader.last_global_indices
            assert ctx.generation is not None
            gen, world, rank = ctx.generation.number, ctx.world_size, ctx.rank
            if state.global_step + 1 == args.rank1_dies_before_step and gen == 0 and world > 1:
                if rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.5)  # not a wait for an event: the kill lands either way
            dies_in_backward = (
                state.global_step + 1 == args.rank1_dies_in_backward and gen == 0 and rank == 1
            )
            optimizer.zero_grad()
            for xb, yb in loader.micro_batches(batch):
                loss = loss_fn(model(xb), yb)
                if args.step_delay:
                    time.sleep(args.step_delay)  # so a kill lands mid-step
                if dies_in_backward:
                    # Not a wait for an event: the others are in the all-reduce by then on
                    # any machine but a starved one, where they learn of the death before
                    # their collective instead (and the run must end the same).
                    time.sleep(1.0)
                    os.kill(os.getpid(), signal.SIGKILL)
                loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            dying = state.global_step + 1 == args.rank1_dies_after_step and world > 1
            if dying and rank == 0 and args.rank0_misses_the_step:
                _wait_for_failure(ctx)
            optimizer.step()
            # Skipped when this step's gradient sync failed (the step is then redone, or
            # adopted from a survivor that completed it): the parameters did not move.
            stepped = any(
                not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)
            )
            scheduler.step()
            # Logged before the step boundary: a released worker leaves inside
            # state.step(), after its last step committed. A step that is rolled back is
            # logged again by its redo, in a later generation, which supersedes this line.
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in model.parameters()]).double()
            log.write(
                json.dumps(
                    {
                        "step": state.global_step + 1,
                        "worker": ctx.worker_id,
                        "epoch": epoch,
                        "gen": gen,
                        "world": world,
                        "rank": rank,
                        "indices": indices,
                        "global_indices": everyone,
                        "batch_ids": batch_ids,
                        "stepped": stepped,
                        "checksum": [flat.sum().item(), flat.abs().sum().item()],
                        "stall": state.last_rescale_stall,
                        "backend": ctx.backend,
                        "gradient_sync": model.gradient_sync,
                        "device": str(flat.device),
                        "time": time.time(),
                        "started": STARTED,
                    }
                )
                + "\n"
            )
            if dying and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if dying:
                # The peer died after a gradient sync that completed: the failure reaches
                # the survivors between their optimizer step and the step boundary.
                _wait_for_failure(ctx)
            state.step()
            # The latest hold reached is the same on every rank of a generation: all of
            # them wait together (a rank waiting alone would stall its peers' collective).
            reached = [step for step in holds if step <= state.global_step]
            if reached:
                hold_for_size(ctx, holds[max(reached)])
    if ctx.rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
        print(f"finished at step {state.global_step}", flush=True)


if __name__ == "__main__":
    main()
