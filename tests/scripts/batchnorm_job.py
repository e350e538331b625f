"""Training script of the worker-count independence tests: an MLP with BatchNorm.

Digits, float64, SGD; ``--sync-batchnorm`` asks ``ElasticDataParallel`` for global-batch
statistics, ``--dropout P`` adds a dropout layer and ``--per-sample-rng`` makes its masks
follow the samples. Every rank appends one JSON line per step to ``OUT/steps-<worker>.jsonl`` with
its local loss and share of the batch (the global loss is their share-weighted sum); rank 0
saves the final parameters and running statistics to ``OUT/final.pt``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def hold_for_next_generation(ctx: tidal.WorkerContext, timeout: float = 120.0) -> None:
    """Wait until the launcher has published the scripted resize, so that it lands within
    the run however fast the steps are (a short job could otherwise finish first)."""
    assert ctx.generation is not None
    current = ctx.generation.number
    deadline = time.monotonic() + timeout
    while ctx.latest_seen <= current:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no generation after {current} within {timeout} s")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sync-batchnorm", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--per-sample-rng", action="store_true")
    parser.add_argument(
        "--hold-at",
        type=int,
        default=0,
        help="after this step, wait (bounded) until the launcher publishes a new generation",
    )
    args = parser.parse_args()
    out = Path(args.out)

    ctx = tidal.init()
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float64), torch.tensor(y))
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU()]
    if args.dropout:
        layers.append(nn.Dropout(args.dropout))
    module = nn.Sequential(*layers, nn.Linear(32, 10)).double()
    model = tidal.ElasticDataParallel(
        module, sync_batchnorm=args.sync_batchnorm, per_sample_rng=args.per_sample_rng
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = tidal.ElasticDataLoader(data, batch_size=64, seed=5)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    log = open(out / f"steps-{ctx.worker_id}.jsonl", "a", buffering=1)  # noqa: SIM115

    for _epoch in state.epochs(1):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            record = {
                "step": state.global_step + 1,
                "world": ctx.world_size,
                "rank": ctx.rank,
                "loss": loss.item(),
                "share": len(loader.last_indices),
                "batch": len(loader.last_global_indices),
            }
            log.write(json.dumps(record) + "\n")
            state.step()
            if state.global_step == args.hold_at:
                hold_for_next_generation(ctx)
            if state.global_step >= args.steps:
                break
    state.finish()
    if ctx.rank == 0:
        torch.save(model.module.state_dict(), out / "final.pt")


if __name__ == "__main__":
    main()
