"""A world-1 job on a GPU (NCCL) that fails on any host synchronisation in its steady
state: after a warm-up, ``torch.cuda.set_sync_debug_mode("error")`` turns every blocking
wait for the device (``.item()``, a copy from pageable memory, a stream synchronise) into
an exception. ``--path`` picks the step: plain, autoscale (adaptive batch size),
micro (micro-batches) or scaler (fp16 autocast with a ``GradScaler``; a fused optimizer,
whose step takes the scaler's inf check without reading it on the host).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=("plain", "autoscale", "micro", "scaler"))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    ctx = tidal.init()
    assert ctx.backend == "nccl" and ctx.device.type == "cuda", (ctx.backend, ctx.device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    data = TensorDataset(x, (x @ torch.randn(64, 10, generator=g)).argmax(1))
    torch.manual_seed(0)
    model = tidal.ElasticDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    )
    scaler = torch.amp.GradScaler("cuda") if args.path == "scaler" else None
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=scaler is not None)
    loader = tidal.ElasticDataLoader(
        data, batch_size=128, seed=0, micro_batch_size=32 if args.path == "micro" else None
    )
    if args.path == "autoscale":
        loader.autoscale_batch_size(512)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader, scaler=scaler)
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    for _epoch in state.epochs(100):
        for batch in loader:
            if done == args.warmup:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            optimizer.zero_grad()
            for xb, yb in loader.micro_batches(batch):
                with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
                    loss = loss_fn(model(xb), yb)
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            state.step()
            done += 1
            if done == args.warmup + args.steps:
                break
        if done == args.warmup + args.steps:
            break
    torch.cuda.set_sync_debug_mode(0)
    state.finish()
    print(f"no host synchronisation in {args.steps} steps ({args.path})", flush=True)


if __name__ == "__main__":
    main()
