"""Worker of ``benchmarks/adaptive_time_to_accuracy.py``: digits to a target test accuracy.

Trains the MLP of ``examples/digits_mlp.py`` (SGD + momentum) at a fixed global batch, or
with ``--autoscale MAX`` from ``--batch-size`` up to ``MAX`` (learning rate by AdaScale).
Every ``--eval-every`` steps each rank evaluates the test split (the ranks hold the same
parameters, so they agree on when to stop); rank 0 writes JSON to ``--result``: seconds
from the first step to the target, steps, samples, final batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from digits_mlp import build_data

import tidal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--autoscale", type=int, default=0, help="max global batch (0: off)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)

    ctx = tidal.init()
    torch.manual_seed(0)
    train, test = build_data(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = tidal.ElasticDataLoader(train, batch_size=args.batch_size, seed=0)
    if args.autoscale:
        loader.autoscale_batch_size(args.autoscale, local_bounds=(1, 256))
        tidal.adaptive_lr(optimizer, loader)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    x_test, y_test = test.tensors

    started: float | None = None
    reached: float | None = None
    samples = 0
    accuracy = 0.0
    for _ in state.epochs(args.max_epochs):
        for x, y in loader:
            if started is None:
                started = time.perf_counter()
            optimizer.zero_grad()
            for xb, yb in loader.micro_batches((x, y)):
                loss_fn(model(xb), yb).backward()
            optimizer.step()
            samples += loader.batch_size
            state.step()
            if state.global_step % args.eval_every == 0:
                with torch.no_grad():
                    accuracy = (model.module(x_test).argmax(1) == y_test).float().mean().item()
                if accuracy >= args.target:
                    reached = time.perf_counter() - (started or 0.0)
                    break
        if reached is not None:
            break
    state.finish()  # every rank leaves at the same step: complete the last agreement
    if ctx.rank == 0:
        Path(args.result).write_text(
            json.dumps(
                {
                    "seconds": reached,
                    "steps": state.global_step,
                    "samples": samples,
                    "accuracy": accuracy,
                    "final_batch": loader.batch_size,
                }
            )
        )


if __name__ == "__main__":
    main()
