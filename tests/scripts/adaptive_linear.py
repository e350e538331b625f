"""Linear regression with a known gradient noise scale, for the noise-scale tests.

``y = x . w* + sigma * eps`` with ``x ~ N(0, I_D)``; the model sits at ``w = w* + d`` and
the learning rate is 0, so the gradient statistics stay put: per-sample gradient
``x (x . d - sigma * eps)``, mean ``d``, trace of covariance ``(D + 1)|d|² + D sigma²``.
Prints (rank 0) one JSON line: the estimate and the analytic noise scale.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    ctx = tidal.init()
    g = torch.Generator().manual_seed(0)
    n = args.batch_size * args.steps
    x = torch.randn(n, args.dim, generator=g, dtype=torch.float64)
    w_star = torch.randn(args.dim, generator=g, dtype=torch.float64)
    y = x @ w_star + args.sigma * torch.randn(n, generator=g, dtype=torch.float64)
    d = torch.zeros(args.dim, dtype=torch.float64)
    d[0] = 1.0
    linear = nn.Linear(args.dim, 1, bias=False).double()
    with torch.no_grad():
        linear.weight.copy_((w_star + d)[None, :])
    model = tidal.ElasticDataParallel(linear)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loader = tidal.ElasticDataLoader(TensorDataset(x, y), batch_size=args.batch_size, seed=0)
    # Bounds that keep the batch where it is: only the statistics are under test.
    adaptive = loader.autoscale_batch_size(args.batch_size)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    for _ in state.epochs(1):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = 0.5 * ((model(xb).squeeze(1) - yb) ** 2).mean()
            loss.backward()
            optimizer.step()
            state.step()
    analytic = (args.dim + 1) * float(d @ d) + args.dim * args.sigma**2
    if ctx.rank == 0:
        print(
            json.dumps(
                {
                    "estimate": adaptive.noise.noise_scale,
                    "analytic": analytic,
                    "samples": adaptive.noise.count,
                    "world": ctx.world_size,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
