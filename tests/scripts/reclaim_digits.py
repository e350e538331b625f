"""A digits MLP whose length follows the reclaim scene: it trains until its world has been
full (``--full`` workers), taken down below that and given back, then ends with the epoch
in which it is full again (and not before ``--min-epochs``).

So a test need not guess how many epochs outlast the scene on a loaded machine. Every
worker takes the same decision: all see the same world size at each step, and
``State.extras`` carries what was seen to a worker that joins later.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import tidal

# The example's split of the digits (the same data the other digits jobs train on).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_mlp import build_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", type=int, required=True, help="the job's full world size")
    parser.add_argument("--min-epochs", type=int, default=8)
    parser.add_argument("--max-epochs", type=int, default=100, help="a bound, should it hang")
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()

    ctx = tidal.init()
    torch.manual_seed(0)
    train, test = build_data(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = tidal.ElasticDataLoader(train, batch_size=64, seed=0)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    loss_fn = nn.CrossEntropyLoss()

    epochs = 0
    for epoch in state.epochs(args.max_epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            state.step()
            if ctx.world_size == args.full:
                state.extras["full"] = True
            elif state.extras.get("full"):
                state.extras["shrunk"] = True
            time.sleep(args.step_delay)
            if ctx.rank == 0 and state.global_step % 5 == 0:
                tidal.log_metrics(loss=loss.item())
        epochs = epoch + 1
        back = state.extras.get("shrunk") and ctx.world_size == args.full
        if back and epochs >= args.min_epochs:
            break
    state.finish()

    if ctx.rank == 0:
        with torch.no_grad():
            x_test, y_test = test.tensors
            accuracy = (model.module(x_test).argmax(1) == y_test).float().mean()
        with open(args.result, "w") as fh:
            json.dump(
                {"accuracy": accuracy.item(), "steps": state.global_step, "epochs": epochs}, fh
            )


if __name__ == "__main__":
    main()
