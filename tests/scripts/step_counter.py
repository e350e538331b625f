"""A training job that says how far it got outside the data dir: after each step it
prints a line (into its log) and writes its step count to ``STEPS_FILE``, for the live
tests that take the data dir's disk away from under it.

``python step_counter.py STEPS_FILE [--step-seconds S] [--pad N]`` (``--pad``: N more
characters on each line, so a log fills whole pages of a disk quickly)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps_file", type=Path)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--pad", type=int, default=0)
    args = parser.parse_args()

    tidal.init()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    y = x @ torch.randn(16, generator=g)
    model = tidal.ElasticDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = tidal.ElasticDataLoader(TensorDataset(x, y), batch_size=32)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    for _ in state.epochs(1_000_000):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = ((model(xb).squeeze(1) - yb) ** 2).mean()
            loss.backward()
            optimizer.step()
            state.step()
            print(f"step {state.global_step} loss {loss.item():.4f} {'.' * args.pad}", flush=True)
            tmp = args.steps_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(str(state.global_step))
            os.replace(tmp, args.steps_file)
            time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()
