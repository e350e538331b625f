"""Digits with a small MLP, elastically, for the chaos suite: slowed down while a hold
file exists (so the job is still training whatever the faults take on a loaded machine),
at full speed once it is gone. Rank 0 writes the test accuracy and the step count.
"""

from __future__ import annotations

import argparse
import json
import os
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
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hold", required=True, help="sleep --held-delay per step while it exists")
    parser.add_argument("--held-delay", type=float, default=0.2)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()

    ctx = tidal.init()
    torch.manual_seed(0)
    train, test = build_data(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = tidal.ElasticDataLoader(train, batch_size=64, seed=0)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    for _epoch in state.epochs(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
            state.step()
            if os.path.exists(args.hold):
                time.sleep(args.held_delay)
    if ctx.rank == 0:
        with torch.no_grad():
            x_test, y_test = test.tensors
            accuracy = (model.module(x_test).argmax(1) == y_test).float().mean()
        with open(args.result, "w") as fh:
            json.dump({"accuracy": accuracy.item(), "steps": state.global_step}, fh)


if __name__ == "__main__":
    main()
