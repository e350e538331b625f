"""A parameter-server job whose worker k trains step t on a fixed slice of digits.

Worker ``k`` of ``W`` uses samples ``[(t*W + k) * B, (t*W + k + 1) * B)`` at step ``t``,
the same order as the all-reduce reference of ``test_training.py``; worker 0 saves the
parameters after ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.ps_digits import build_data, build_model  # noqa: E402

import tidal.ps  # noqa: E402

LR, MOMENTUM = 0.1, 0.9


@functools.cache
def _train() -> tuple[torch.Tensor, ...]:
    return tuple(build_data(0)[0].tensors)


def batch(t: int, k: int, world: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker ``k``'s batch at step ``t``."""
    x, y = _train()
    start = (t * world + k) * size
    return x[start : start + size], y[start : start + size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tidal.ps.ParameterServerModel(
        build_model(32), lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM)
    )
    loss_fn = nn.CrossEntropyLoss()
    k = model.spec.index
    with model:
        for t in range(args.steps):
            x, y = batch(t, k, args.workers, args.batch_size)
            loss_fn(model(x), y).backward()
            assert model.push(), "every gradient of a step is averaged (replicas = workers)"
        model.pull()
        if k == 0:
            torch.save(model.module.state_dict(), Path(args.out) / "ps.pt")


if __name__ == "__main__":
    main()
