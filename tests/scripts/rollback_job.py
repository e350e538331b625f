"""Training script of the exact-rollback tests: AdamW, a OneCycle schedule, clipping.

A small float64 MLP on digits (no BatchNorm, no dropout: its result does not depend on the
number of workers). ``--die-step S --die-point P --die-rank R`` makes the worker at rank
``R`` SIGKILL itself at point ``P`` of step ``S`` (once per run: the first worker to get
there writes ``OUT/died`` before it dies):

``before_forward``, ``after_backward`` (gradients synchronised), ``after_optimizer``,
``after_scheduler`` (the next step's lr and betas written into ``param_groups``), or
``in_step`` (inside ``state.step()``, after the step committed, before the agreement).

Every rank appends one JSON line per step to ``OUT/steps-<worker>.jsonl`` with the
hyperparameters the step ran with and a checksum of the parameters after it; rank 0 saves
the final parameters to ``OUT/final.pt``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import tidal

POINTS = ("before_forward", "after_backward", "after_optimizer", "after_scheduler", "in_step")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--die-step", type=int, default=0)
    parser.add_argument("--die-point", choices=POINTS, default="before_forward")
    parser.add_argument("--die-rank", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.out)

    ctx = tidal.init()
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    data = TensorDataset(torch.tensor(x, dtype=torch.float64), torch.tensor(y))
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).double()
    model = tidal.ElasticDataParallel(module)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loader = tidal.ElasticDataLoader(data, batch_size=60, seed=3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.02, total_steps=args.steps + 1
    )
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    loss_fn = nn.CrossEntropyLoss()
    log = open(out / f"steps-{ctx.worker_id}.jsonl", "a", buffering=1)  # noqa: SIM115

    def maybe_die(point: str) -> None:
        if (
            point == args.die_point
            and state.global_step + 1 == args.die_step
            and ctx.rank == args.die_rank
            and ctx.world_size > args.die_rank
        ):
            try:
                fd = os.open(out / "died", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return  # someone died here already: once per run
            os.write(fd, f"{ctx.worker_id} {point} step {args.die_step}\n".encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)

    agree = state._agree  # the agreement runs inside state.step(), after the commit

    def dying_agree() -> Any:
        if state.global_step == args.die_step:
            state.global_step -= 1  # maybe_die counts the step in flight
            try:
                maybe_die("in_step")
            finally:
                state.global_step += 1
        return agree()

    state._agree = dying_agree  # type: ignore[method-assign]

    done = False
    for _epoch in state.epochs(1000):
        for xb, yb in loader:
            group = optimizer.param_groups[0]
            used = {"lr": float(group["lr"]), "betas": list(group["betas"])}
            assert ctx.generation is not None
            gen, world, rank = ctx.generation.number, ctx.world_size, ctx.rank
            maybe_die("before_forward")
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            maybe_die("after_backward")
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            before = [p.detach().clone() for p in model.parameters()]
            optimizer.step()
            maybe_die("after_optimizer")
            scheduler.step()
            maybe_die("after_scheduler")
            stepped = any(
                not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)
            )
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in model.parameters()])
            record = {
                "step": state.global_step + 1,
                "worker": ctx.worker_id,
                "gen": gen,
                "world": world,
                "rank": rank,
                "epoch": loader.epoch,
                "indices": loader.last_indices,
                "global_indices": loader.last_global_indices,
                "stepped": stepped,
                "checksum": [flat.sum().item(), flat.abs().sum().item()],
                **used,
            }
            log.write(json.dumps(record) + "\n")
            state.step()
            if state.global_step >= args.steps:
                done = True
                break
        if done:
            break
    state.finish()
    if ctx.rank == 0:
        torch.save(model.module.state_dict(), out / "final.pt")
        print(f"finished at step {state.global_step}", flush=True)


if __name__ == "__main__":
    main()
