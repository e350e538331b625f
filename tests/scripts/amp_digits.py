"""Training script of the control-channel and mixed-precision tests: digits, a float32
MLP, optionally a ``GradScaler``, bf16 autocast or ``torch.compile``, and an audit trail.

Every step appends one JSON line per rank to ``OUT/steps-<worker>.jsonl``: the step, its
generation and world, the samples it consumed, whether the parameters moved, a checksum of
them, the scaler's scale after the step, and how many collectives this step issued on the
main process group outside ``loss.backward()`` (where the gradients are all-reduced).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import tidal

#: Collectives of a process group, counted (they are passed through unchanged): the
#: methods every ``torch.distributed`` function calls, which the gradient hook and the
#: guarded group (what DDP runs over on gloo) also call directly. The control channel is a
#: bare gloo backend, not a ``ProcessGroup``: its collectives are not counted.
_COUNTED = ("allreduce", "broadcast", "allgather", "_allgather_base", "barrier")
calls = {"count": 0}


def _counting(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        calls["count"] += 1
        return original(*args, **kwargs)

    return call


def count_main_group_collectives() -> None:
    """Count every collective issued on a ``ProcessGroup`` (the main group's)."""
    for name in _COUNTED:
        setattr(dist.ProcessGroup, name, _counting(getattr(dist.ProcessGroup, name)))


def hold_for_size(ctx: tidal.WorkerContext, size: int, timeout: float = 120.0) -> None:
    """Unless the world has ``size`` workers, wait for a newer generation (see
    elastic_digits.py)."""
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--scaler", action="store_true", help="train through a GradScaler")
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the module")
    parser.add_argument("--inf-at", type=int, default=0, help="rank 0's loss is inf at this step")
    parser.add_argument("--rank1-dies-before-step", type=int, default=0)
    parser.add_argument("--hold-at", default="", help="STEP:N[,STEP:N...] (elastic_digits.py)")
    args = parser.parse_args()
    holds = dict(
        (int(step), int(n))
        for step, n in (item.split(":") for item in args.hold_at.split(",") if item)
    )
    count_main_group_collectives()

    ctx = tidal.init()
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))
    torch.manual_seed(0)
    net: nn.Module = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    if args.compile:
        # dynamic: the local batch changes with the world; no recompile at each size.
        net = torch.compile(net, dynamic=True)  # type: ignore[assignment]
    model = tidal.ElasticDataParallel(net)
    if args.compile:
        # Compile (forward and backward) before joining: the peers would otherwise wait
        # in their first all-reduce for as long as this worker compiles.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            model(data.tensors[0][:7]).float().sum().backward()
        model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A short growth interval, so the scale moves during the run and a lost or doubled
    # update of the scaler's state shows.
    scaler = (
        torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=4) if args.scaler else None
    )
    loader = tidal.ElasticDataLoader(data, batch_size=args.batch_size, seed=1)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scaler=scaler)
    loss_fn = nn.CrossEntropyLoss()
    died = Path(args.out) / "died"
    log = open(os.path.join(args.out, f"steps-{ctx.worker_id}.jsonl"), "a", buffering=1)  # noqa: SIM115

    for _epoch in state.epochs(args.epochs):
        for xb, yb in loader:
            calls["count"] = 0
            assert ctx.generation is not None
            gen, world, rank = ctx.generation.number, ctx.world_size, ctx.rank
            step = state.global_step + 1
            if step == args.rank1_dies_before_step and world > 1 and not died.exists():
                if rank == 1:
                    died.touch()  # once per run, whatever the generation
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.5)  # not a wait for an event: the kill lands either way
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = model(xb)
            loss = loss_fn(out.float(), yb)
            if step == args.inf_at and rank == 0:
                loss = loss * float("inf")  # every rank's summed gradient is inf/NaN
            outside = calls["count"]  # the forward's (none expected)
            backward_started = calls["count"]
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            backward_done = calls["count"]
            before = [p.detach().clone() for p in model.parameters()]
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            stepped = any(
                not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)
            )
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in model.parameters()]).double()
            state.step()
            outside += calls["count"] - backward_done
            control = getattr(ctx, "control", None)
            log.write(
                json.dumps(
                    {
                        "step": step,
                        "worker": ctx.worker_id,
                        "epoch": loader.epoch,
                        "gen": gen,
                        "world": world,
                        "rank": rank,
                        "global_indices": loader.last_global_indices,
                        "indices": loader.last_indices,
                        "stepped": stepped,
                        "checksum": [flat.sum().item(), flat.abs().sum().item()],
                        "scale": scaler.get_scale() if scaler is not None else None,
                        "main_outside_backward": outside,
                        "main_in_backward": backward_done - backward_started,
                        "control": type(control.group).__name__ if control else None,
                    }
                )
                + "\n"
            )
            reached = [s for s in holds if s <= state.global_step]
            if reached:
                hold_for_size(ctx, holds[max(reached)])
    if ctx.rank == 0:
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
        print(f"finished at step {state.global_step}", flush=True)


if __name__ == "__main__":
    main()
