"""Digits with the adaptive batch size, for the multi-process tests: an audit trail.

Each committed step appends one JSON line per rank to ``OUT/steps-<worker>.jsonl``: the
generation, world, rank, the global batch it ran at, the adaptive statistics it held and
a checksum of the parameters. ``--sleep-fixed`` and ``--sleep-per-sample`` add a known
compute time per step (``fixed + per_sample * local batch``), so the throughput model has
something clear to find on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--sleep-fixed", type=float, default=0.02)
    parser.add_argument("--sleep-per-sample", type=float, default=0.0005)
    parser.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="fetch batches ahead in this many persistent loader worker processes (each "
        "batch then carries its sample indices, logged as batch_ids)",
    )
    args = parser.parse_args()

    ctx = tidal.init()
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    tensors = [torch.tensor(x, dtype=torch.float64), torch.tensor(y)]
    if args.num_workers:
        tensors.append(torch.arange(len(y)))
    data = TensorDataset(*tensors)
    torch.manual_seed(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).double()
    )
    workers: dict[str, Any] = {}
    if args.num_workers:
        workers = {"num_workers": args.num_workers, "persistent_workers": True}
    loader = tidal.ElasticDataLoader(data, batch_size=args.batch_size, seed=1, **workers)
    adaptive = loader.autoscale_batch_size(args.max_batch, local_bounds=(4, 128))
    optimizer = tidal.adaptive_lr(torch.optim.SGD(model.parameters(), lr=0.05), loader)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    log = open(os.path.join(args.out, f"steps-{ctx.worker_id}.jsonl"), "a", buffering=1)  # noqa: SIM115

    for _epoch in state.epochs(args.epochs):
        for batch in loader:
            assert ctx.generation is not None
            gen, world, rank = ctx.generation.number, ctx.world_size, ctx.rank
            size, indices = loader.batch_size, loader.last_indices
            batch_ids = batch[2].tolist() if args.num_workers else None
            optimizer.zero_grad()
            for xb, yb, *_ in loader.micro_batches(batch):
                loss = loss_fn(model(xb), yb)
                time.sleep(args.sleep_per_sample * len(xb))
                loss.backward()
            time.sleep(args.sleep_fixed)
            optimizer.step()
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in model.parameters()])
            log.write(
                json.dumps(
                    {
                        "step": state.global_step + 1,
                        "worker": ctx.worker_id,
                        "gen": gen,
                        "world": world,
                        "rank": rank,
                        "batch": size,
                        "epoch": loader.epoch,
                        "indices": indices,
                        "batch_ids": batch_ids,
                        "noise_samples": adaptive.noise.count,
                        "noise_scale": adaptive.noise.noise_scale,
                        "progress": adaptive.progress,
                        "pending": adaptive.pending,
                        "gradient_sync": model.gradient_sync,
                        "checksum": [flat.sum().item(), flat.abs().sum().item()],
                    }
                )
                + "\n"
            )
            state.step()
    if ctx.rank == 0:
        print(f"finished at step {state.global_step} batch {loader.batch_size}", flush=True)


if __name__ == "__main__":
    main()
