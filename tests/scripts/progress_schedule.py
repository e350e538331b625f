"""A progress-following LR schedule through the real loader, alone (no launcher).

Noisy linear regression from batch 16. The runtime may only choose ``--raised`` (each
worker's share bounded below by it), so its first decision raises the batch there, at a
step that does not depend on timing; each later step is worth its AdaScale gain in
progress. A ``tidal.progress_lr`` schedule ``1 / (1 + p / 10)`` sets the rate; before
every step the script records the group's rate, the loader's progress and batch.
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
    parser.add_argument("--raised", type=int, default=128)
    args = parser.parse_args()

    tidal.init()
    torch.manual_seed(0)  # the model's start, so the noise estimate's too
    g = torch.Generator().manual_seed(0)
    n = args.raised * args.steps
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, generator=g) + 3.0 * torch.randn(n, generator=g)
    model = tidal.ElasticDataParallel(nn.Linear(8, 1))
    loader = tidal.ElasticDataLoader(TensorDataset(x, y), batch_size=16, seed=0)
    # One choice: the goodput fit, which depends on measured step times, cannot pick
    # another batch, and the runtime moves to it once the noise estimate is trusted.
    adaptive = loader.autoscale_batch_size(args.raised, local_bounds=(args.raised, args.raised))
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    scheduler = tidal.progress_lr(optimizer, loader, schedule)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    records = []
    for _ in state.epochs(1):
        for xb, yb in loader:
            records.append((optimizer.param_groups[0]["lr"], adaptive.progress, len(yb)))
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            scheduler.step()
            state.step()
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
