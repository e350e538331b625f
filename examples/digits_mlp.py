"""Classify scikit-learn's bundled handwritten digits with a small MLP, elastically.

Runs alone (``python examples/digits_mlp.py``) or under ``tidal run --workers 1:4 ...``;
the result does not depend on how many workers there were. Reaches > 95% test accuracy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def build_data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Standardised digits, split 80/20."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    # Pixels that never vary in the training split get unit scale, not a division by ~0.
    scaler = StandardScaler().fit(x_train)

    def to_set(a: np.ndarray, b: np.ndarray) -> TensorDataset:
        return TensorDataset(
            torch.tensor(scaler.transform(a), dtype=torch.float32), torch.tensor(b)
        )

    return to_set(x_train, y_train), to_set(x_test, y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (demo)")
    parser.add_argument("--result", help="write final metrics as JSON here (rank 0)")
    parser.add_argument("--log-every", type=int, default=5, help="steps between log_metrics")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("TIDAL_LOG_LEVEL", "WARNING"))

    ctx = tidal.init()
    torch.manual_seed(args.seed)
    train, test = build_data(args.seed)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    total_steps = args.epochs * -(-len(train) // args.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    loader = tidal.ElasticDataLoader(train, batch_size=args.batch_size, seed=args.seed)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler)
    loss_fn = nn.CrossEntropyLoss()

    last_time, last_step = time.perf_counter(), state.global_step
    for epoch in state.epochs(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            state.step()
            if args.step_delay:
                time.sleep(args.step_delay)
            if ctx.rank == 0 and state.global_step % args.log_every == 0:
                # Buffered and sent about once a second: costs the step nothing.
                now = time.perf_counter()
                steps = max(state.global_step - last_step, 1)
                tidal.log_metrics(
                    loss=loss.item(),
                    accuracy=(out.argmax(1) == y).float().mean().item(),
                    samples_per_s=steps * loader.batch_size / max(now - last_time, 1e-9),
                    progress=state.global_step / total_steps,  # the dashboard's progress bar
                )
                last_time, last_step = now, state.global_step
        if ctx.rank == 0:
            print(
                f"epoch {epoch} step {state.global_step} world {ctx.world_size} "
                f"loss {loss.item():.4f}",
                flush=True,
            )

    if ctx.rank == 0:
        with torch.no_grad():
            x, y = (t.to(ctx.device) for t in test.tensors)
            accuracy = (model.module(x).argmax(1) == y).float().mean().item()
        print(f"test accuracy {accuracy:.4f}", flush=True)
        if args.result:
            with open(args.result, "w") as fh:
                json.dump({"accuracy": accuracy, "steps": state.global_step}, fh)


if __name__ == "__main__":
    main()
