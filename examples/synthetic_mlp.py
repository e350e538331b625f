"""Train an MLP of a chosen size on synthetic data, elastically (the benchmarks' workload).

Runs alone (``python examples/synthetic_mlp.py``) or under
``tidal run --workers 1:4 -- examples/synthetic_mlp.py --params 6.3e6 --steps 200``.
Inputs are seeded Gaussian vectors and the targets come from a fixed random "teacher", so
nothing is downloaded and every run sees the same data.

``--trace DIR`` makes each worker append one JSON line per committed step to
``DIR/<worker>.jsonl``: ``{"step", "t", "cpu", "world", "rank", "worker"}`` where ``t`` is
the wall clock (``time.time()``) when the step's optimizer update was done, ``cpu`` the
process's CPU time then (all threads), ``world`` the number of workers that computed it
and ``step`` the job's step count after it; ``"switch"`` is added
to the step after which the worker changed generation (to the redone step after a failure):
``State.last_rescale_stall``, the runtime's own measure of the switch. A step whose
gradient sync failed (a peer died) is not committed and not traced; the job redoes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal

INPUTS = 256
CLASSES = 10


def mlp_params(inputs: int, hidden: int, layers: int, classes: int) -> int:
    """Parameters of an MLP with ``layers`` hidden layers of width ``hidden``."""
    return (inputs + 1) * hidden + (layers - 1) * (hidden + 1) * hidden + (hidden + 1) * classes


def hidden_width(
    params: float, inputs: int = INPUTS, layers: int = 2, classes: int = CLASSES
) -> int:
    """The hidden width whose MLP has the parameter count closest to ``params``."""
    # (layers-1) h^2 + (inputs + classes + layers) h + classes = params
    a, b, c = layers - 1, inputs + classes + layers, classes - params
    guess = -c / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    candidates = {max(1, math.floor(guess)), max(1, math.ceil(guess))}
    return min(candidates, key=lambda h: abs(mlp_params(inputs, h, layers, classes) - params))


def build_model(params: float, layers: int = 2, seed: int = 0) -> nn.Sequential:
    """An MLP with about ``params`` parameters (same weights for the same seed)."""
    hidden = hidden_width(params, layers=layers)
    torch.manual_seed(seed)
    modules: list[nn.Module] = []
    width = INPUTS
    for _ in range(layers):
        modules += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    modules.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*modules)


def build_data(samples: int, seed: int = 0) -> TensorDataset:
    """Seeded random inputs labelled by a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, INPUTS, generator=g)
    teacher = torch.randn(INPUTS, CLASSES, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


class Trace:
    """Append one JSON line per committed step to ``DIR/<worker>.jsonl``."""

    def __init__(self, directory: str | None, worker: str) -> None:
        self.worker = worker
        self.fd: int | None = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            path = Path(directory) / f"{worker}.jsonl"
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **fields: object) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps({**fields, "worker": self.worker}) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=float, default=6.3e6, help="model size (parameters)")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=96, help="global batch size")
    parser.add_argument("--samples", type=int, default=16384, help="dataset size")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--trace", help="directory for per-worker JSON-lines step traces")
    parser.add_argument("--log-every", type=int, default=20, help="print a line every N steps")
    parser.add_argument(
        "--autoscale",
        type=int,
        default=0,
        help="adaptive batch size up to this global batch (= --batch-size: statistics only)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("TIDAL_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(args.threads)

    ctx = tidal.init()
    net = build_model(args.params, args.layers, args.seed)
    n_params = sum(p.numel() for p in net.parameters())
    model = tidal.ElasticDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = tidal.ElasticDataLoader(
        build_data(args.samples, args.seed), batch_size=args.batch_size, seed=args.seed
    )
    if args.autoscale:
        loader.autoscale_batch_size(args.autoscale)
        tidal.adaptive_lr(optimizer, loader)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    trace = Trace(args.trace, ctx.worker_id)
    loss_fn = nn.CrossEntropyLoss()
    epochs = -(-args.steps // len(loader)) + 1
    extra: dict[str, object] = {}

    if ctx.rank == 0:
        print(f"model: {n_params} parameters; global batch {args.batch_size}", flush=True)
    for _ in state.epochs(epochs):
        for x, y in loader:
            world, rank = ctx.world_size, ctx.rank
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            done = time.time()
            before, switches = state.global_step, state.last_rescale_stall
            state.step()
            if state.last_rescale_stall is not switches:  # the runtime's own measure
                extra["switch"] = state.last_rescale_stall
            if state.global_step == before:
                continue  # the gradient sync failed: nothing committed, the step is redone
            trace.write(
                step=state.global_step,
                t=done,
                cpu=time.process_time(),
                world=world,
                rank=rank,
                **extra,
            )
            extra = {}
            if ctx.rank == 0 and state.global_step % args.log_every == 0:
                print(
                    f"step {state.global_step} world {ctx.world_size} loss {loss.item():.4f}",
                    flush=True,
                )
            if state.global_step >= args.steps:
                break
        if state.global_step >= args.steps:
            break
    if ctx.rank == 0:
        print(f"done: {state.global_step} steps, loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
