"""Worker of ``benchmarks/adaptive_time_to_accuracy.py``: train to a target test accuracy.

``--dataset digits``: scikit-learn's digits (``examples/digits_mlp.py``'s split), an MLP
64 → ``--hidden`` → 10. ``--dataset teacher``: ``examples/synthetic_mlp.py``'s seeded inputs
labelled by a random linear teacher (40,000 samples, the last 7,232 held out), its MLP of
``--params`` parameters. SGD + momentum at a fixed global batch, or with ``--autoscale MAX``
from ``--batch-size`` up to ``MAX`` (learning rate by AdaScale). Every ``--eval-every``
steps each rank evaluates the held-out split (the ranks hold the same parameters, so they
agree on when to stop); rank 0 writes JSON to ``--result``: seconds from the first step to
the target, steps, samples, final batch.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from digits_mlp import build_data
from synthetic_mlp import build_data as teacher_data
from synthetic_mlp import build_model as teacher_model

import tidal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", choices=("digits", "teacher"), default="teacher")
    parser.add_argument("--params", type=float, default=3e5, help="teacher: MLP size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--autoscale", type=int, default=0, help="max global batch (0: off)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-rule", default="auto", help="adaptive_lr rule (autoscale only)")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width (compute per sample)")
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tidal.runtime").setLevel(logging.INFO)  # the batch decisions

    ctx = tidal.init()
    torch.manual_seed(0)
    if args.dataset == "digits":
        train, test = build_data(0)
        module: nn.Module = nn.Sequential(
            nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)
        )
    else:
        x, y = teacher_data(40_000, 0).tensors
        train, test = TensorDataset(x[:32768], y[:32768]), TensorDataset(x[32768:], y[32768:])
        module = teacher_model(args.params, 2, 0)
    model = tidal.ElasticDataParallel(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = tidal.ElasticDataLoader(train, batch_size=args.batch_size, seed=0)
    if args.autoscale:
        loader.autoscale_batch_size(args.autoscale, local_bounds=(1, 256))
        tidal.adaptive_lr(optimizer, loader, rule=args.lr_rule)
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
                if ctx.rank == 0 and state.global_step % (20 * args.eval_every) == 0:
                    print(
                        f"step {state.global_step} batch {loader.batch_size} "
                        f"accuracy {accuracy:.3f}",
                        flush=True,
                    )
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
