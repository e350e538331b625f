"""A progress-following LR schedule through the real loader, alone (no launcher).

Noisy linear regression from batch 16; after ``--switch`` steps the batch is raised to
``--raised`` (as a decision of the runtime would), so each later step is worth its
AdaScale gain in progress. A ``tidal.progress_lr`` schedule ``1 / (1 + p / 10)`` sets the
rate; before every step the script records the group's rate and the loader's progress.
Prints one JSON line: the records, the steps, the final progress and batch.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal

BASE_LR = 0.01


def schedule(progress: float) -> float:
    """The schedule under test: halved after 10 initial-batch steps of progress."""
    return 1.0 / (1.0 + progress / 10.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--switch", type=int, default=10)
    parser.add_argument("--raised", type=int, default=128)
    args = parser.parse_args()

    tidal.init()
    g = torch.Generator().manual_seed(0)
    n = 16 * args.switch + args.raised * (args.steps - args.switch)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, generator=g) + 3.0 * torch.randn(n, generator=g)
    model = tidal.ElasticDataParallel(nn.Linear(8, 1))
    loader = tidal.ElasticDataLoader(TensorDataset(x, y), batch_size=16, seed=0)
    adaptive = loader.autoscale_batch_size(args.raised)
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    scheduler = tidal.progress_lr(optimizer, loader, schedule)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    records = []
    for _ in state.epochs(1):
        for xb, yb in loader:
            records.append((optimizer.param_groups[0]["lr"], adaptive.progress))
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            state.step()
            if state.global_step == args.switch:
                adaptive.apply(args.raised)
            if state.global_step == args.steps:
                break
    print(
        json.dumps(
            {
                "records": records,
                "steps": state.global_step,
                "progress": adaptive.progress,
                "batch": loader.batch_size,
                "lr": optimizer.param_groups[0]["lr"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
