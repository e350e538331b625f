"""What the runtime adds to one training step, on CPU: time inside ``State.step()`` and in
the gradient hook, per step, with a small MLP (the step's compute is small, so the
runtime's share shows).

Run it alone (world 1) or as a job (world 2); rank 0 prints the figures and, with
``--profile``, the top of a cProfile of the measured steps (``State.step()`` and the
gradient hook, ``_weighted_allreduce``, among them; profiling slows every call down, so
read its times as shares, and take the figures from a run without it):

    PYTHONPATH=src:. python benchmarks/step_cost.py --steps 200
    PYTHONPATH=src:. python -m tidal.cli run --workers 2 -- benchmarks/step_cost.py --steps 200

Figures are medians over the steps after ``--warmup`` (robust to other users' load on a
shared machine); ``step`` is the whole loop iteration (load, forward, backward with the
hook, optimizer, ``State.step()``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal
from tidal.runtime.env import ENV_SYNC_EVERY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sync-every", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sync_every is not None:
        # The runtime's settings are read from the environment once, at init.
        os.environ[ENV_SYNC_EVERY] = str(args.sync_every)
    ctx = tidal.init()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size * 64, 32, generator=g)
    data = TensorDataset(x, (x @ torch.randn(32, 4, generator=g)).argmax(1))
    torch.manual_seed(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    loader = tidal.ElasticDataLoader(data, batch_size=args.batch_size, seed=0)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    loss_fn = nn.CrossEntropyLoss()
    profiler = cProfile.Profile()
    in_state: list[float] = []
    whole: list[float] = []
    done = 0
    for _epoch in state.epochs(10_000):
        for xb, yb in loader:
            measured = done >= args.warmup
            if measured and args.profile:
                profiler.enable()
            started = time.perf_counter()
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
            scheduler.step()
            before = time.perf_counter()
            state.step()
            end = time.perf_counter()
            if measured and args.profile:
                profiler.disable()
            if measured:
                in_state.append(end - before)
                whole.append(end - started)
            done += 1
            if done >= args.warmup + args.steps:
                break
        if done >= args.warmup + args.steps:
            break
    state.finish()
    if ctx.rank == 0:
        print(
            f"world {ctx.world_size}, sync_every {ctx.config.sync_every}, {len(whole)} steps: "
            f"State.step() median {statistics.median(in_state) * 1e6:.0f} us, "
            f"whole step median {statistics.median(whole) * 1e6:.0f} us",
            flush=True,
        )
        if args.profile:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(
                r"tidal|distributed_c10d|copy", 25
            )
            print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
