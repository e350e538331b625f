"""A job with a synthetic step time, for the live goodput policy test.

``--per-sample S``: each step sleeps ``S x local batch`` (it scales: more workers, shorter
steps); ``--fixed F``: each step sleeps ``F`` whatever the worker count (it does not).
The batch is fixed (autoscale with ``max_global`` = batch): the runtime still measures and
reports its throughput model, which is what the policy reads.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-sample", type=float, default=0.0)
    parser.add_argument("--fixed", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1000)
    args = parser.parse_args()

    tidal.init()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    y = x @ torch.randn(16, generator=g) + torch.randn(4096, generator=g)
    model = tidal.ElasticDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = tidal.ElasticDataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    loader.autoscale_batch_size(args.batch_size)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    for _ in state.epochs(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = ((model(xb).squeeze(1) - yb) ** 2).mean()
            time.sleep(args.fixed + args.per_sample * len(xb))
            loss.backward()
            optimizer.step()
            state.step()


if __name__ == "__main__":
    main()
