"""One measured training run of ``benchmarks/gpu_overhead.py``: a plain loop, DDP, or tidal.

* ``--mode plain``: ``python benchmarks/gpu_worker.py --mode plain ...``, no process group;
* ``--mode ddp``: under ``python -m torch.distributed.run --standalone --nproc_per_node 1``:
  ``DistributedDataParallel`` on NCCL (gloo on the CPU);
* ``--mode tidal``: under ``python -m tidal.cli run --workers 1 -- ...``:
  ``tidal.ElasticDataParallel``, ``tidal.ElasticDataLoader`` and ``tidal.State.step()``
  every step, as ``examples/synthetic_mlp.py`` trains.

Each run takes the same model, optimizer (SGD with momentum) and samples: the baselines
take the batches tidal's loader takes (its per-epoch permutation), gathered without a host
synchronisation (see :func:`batches`). After ``--warmup`` steps,
the next ``--steps`` are timed in ``--windows`` windows; the device is synchronised at the
windows' boundaries only, never inside them. Then (CUDA only) ``--sync-steps`` more steps
run under ``torch.cuda.set_sync_debug_mode("warn")``, and the host synchronisations they
make are counted, with the source line of each. Rank 0 writes a JSON result to
``--result``. ``--profile FILE``: a cProfile of the timed steps (the host's side of a
step: on a small model, what the step costs is what the CPU spends launching it), the
functions that take the most time themselves first, written to FILE (it slows every
Python call down: read it as shares, take times from a run without it).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_models import Workload, workload

ROOT = Path(__file__).resolve().parents[1]


class Meter:
    """Times the steps between window boundaries (synchronising the device there only),
    then counts the host synchronisations of the steps that follow."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.device = device
        w, n = args.warmup, args.steps
        self.bounds = sorted({w + round(i * n / args.windows) for i in range(args.windows + 1)})
        self.times: dict[int, float] = {}
        self.count_from = w + n
        self.count_to = w + n + (args.sync_steps if device.type == "cuda" else 0)
        self.total = self.count_to
        self._caught: list[warnings.WarningMessage] | None = None
        self._catcher: Any = None
        self._profile_to: str | None = args.profile
        self._profiler = cProfile.Profile() if args.profile else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def at(self, done: int) -> None:
        """Called with the number of steps done (0 before the first)."""
        if done == self.count_to and self._catcher is not None:
            torch.cuda.set_sync_debug_mode(0)
            self._catcher.__exit__(None, None, None)
            self._catcher = None
        if self._profiler is not None and done == self.count_from:
            self._profiler.disable()
            self._write_profile(done - self.bounds[0])
        if done in self.bounds:
            self._sync()
            self.times[done] = time.perf_counter()
        if self._profiler is not None and done == self.bounds[0]:
            self._profiler.enable()
        if done == self.count_from and self.count_to > self.count_from:
            self._catcher = warnings.catch_warnings(record=True)
            self._caught = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    def _write_profile(self, steps: int) -> None:
        assert self._profiler is not None and self._profile_to is not None
        out = io.StringIO()
        print(f"cProfile of {steps} timed steps (tottime: time in the function itself)", file=out)
        pstats.Stats(self._profiler, stream=out).sort_stats("tottime").print_stats(40)
        Path(self._profile_to).write_text(out.getvalue())

    def result(self) -> dict[str, Any]:
        windows = []
        for a, b in zip(self.bounds, self.bounds[1:], strict=False):
            if a in self.times and b in self.times and b > a:
                windows.append((self.times[b] - self.times[a]) / (b - a) * 1e3)
        first, last = self.bounds[0], self.bounds[-1]
        out: dict[str, Any] = {
            "window_ms": windows,
            "ms_per_step": statistics.median(windows) if windows else None,
            "mean_ms": (self.times[last] - self.times[first]) / (last - first) * 1e3
            if first in self.times and last in self.times and last > first
            else None,
        }
        if self._caught is not None:
            syncs = [w for w in self._caught if "synchroniz" in str(w.message)]
            sites = collections.Counter(f"{_short(w.filename)}:{w.lineno}" for w in syncs)
            steps = self.count_to - self.count_from
            out["syncs_per_step"] = len(syncs) / steps
            out["sync_sites"] = dict(sites.most_common())
        return out


def _short(filename: str) -> str:
    """A source file named from the repository (or from site-packages)."""
    path = Path(filename)
    for base in (ROOT / "src", ROOT):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return filename


def batches(
    data: TensorDataset, batch: int, seed: int, world: int, rank: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, ...]]:
    """The baselines' batches: the samples tidal's loader takes (its per-epoch permutation,
    a contiguous share of each global batch), fetched as a careful GPU loop does, with no
    host synchronisation: the permutation is copied to the data's GPU asynchronously (from
    pinned memory) and the samples gathered there; data on the CPU are gathered there,
    pinned and copied asynchronously."""
    n = len(data)
    where = data.tensors[0].device
    per_epoch = n // batch
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    hi = lo + base + (1 if rank < extra else 0)
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g)
        if where.type == "cuda":
            order = order.pin_memory().to(where, non_blocking=True)
        for position in range(per_epoch):
            start = position * batch
            index = order[start + lo : start + hi]
            out = tuple(torch.index_select(t, 0, index) for t in data.tensors)
            if device.type == "cuda" and where.type == "cpu":
                out = tuple(t.pin_memory().to(device, non_blocking=True) for t in out)
            yield out
        epoch += 1


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: Workload,
    source: Iterator[tuple[torch.Tensor, ...]],
    meter: Meter,
) -> None:
    """The baselines' loop: ``meter.total`` steps."""
    meter.at(0)
    for done in range(1, meter.total + 1):
        x, y = next(source)
        optimizer.zero_grad()
        spec.loss(model(x), y).backward()
        optimizer.step()
        meter.at(done)


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(device)
        try:
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # a tuple; an int in older torch
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
        except Exception as exc:  # a build without NCCL
            info["nccl"] = f"unknown ({exc})"
        info["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        info["threads"] = torch.get_num_threads()
    return info


def run_plain(args: argparse.Namespace, spec: Workload) -> tuple[int, Meter, torch.device, int]:
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = spec.build(device).to(device)
    data = spec.data(spec.batch * spec.epoch_steps, _data_device(args, device), args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    meter = Meter(args, device)
    train_steps(model, optimizer, spec, batches(data, spec.batch, args.seed, 1, 0, device), meter)
    return 0, meter, device, sum(p.numel() for p in model.parameters())


def run_ddp(args: argparse.Namespace, spec: Workload) -> tuple[int, Meter, torch.device, int]:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    module = spec.build(device).to(device)
    params = sum(p.numel() for p in module.parameters())
    model = DistributedDataParallel(module, device_ids=[local] if device.type == "cuda" else None)
    data = spec.data(spec.batch * spec.epoch_steps, _data_device(args, device), args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    meter = Meter(args, device)
    source = batches(data, spec.batch, args.seed, world, rank, device)
    train_steps(model, optimizer, spec, source, meter)
    dist.barrier()
    dist.destroy_process_group()
    return rank, meter, device, params


def run_tidal(args: argparse.Namespace, spec: Workload) -> tuple[int, Meter, torch.device, int]:
    import tidal

    ctx = tidal.init()
    device = ctx.device
    if device.type != args.device:
        raise SystemExit(
            f"tidal put this worker on {device} ({ctx.backend}), not on {args.device}: "
            "see TIDAL_BACKEND and CUDA_VISIBLE_DEVICES"
        )
    module = spec.build(device)
    params = sum(p.numel() for p in module.parameters())
    model = tidal.ElasticDataParallel(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = spec.data(spec.batch * spec.epoch_steps, _data_device(args, device), args.seed)
    loader = tidal.ElasticDataLoader(data, batch_size=spec.batch, seed=args.seed)
    state = tidal.State(model=model, optimizer=optimizer, loader=loader)
    meter = Meter(args, device)
    epochs = -(-meter.total // len(loader)) + 1
    meter.at(0)
    for _ in state.epochs(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            spec.loss(model(x), y).backward()
            optimizer.step()
            state.step()
            meter.at(state.global_step)
            if state.global_step >= meter.total:
                break
        if state.global_step >= meter.total:
            break
    state.finish()
    return ctx.rank, meter, device, params


def _data_device(args: argparse.Namespace, device: torch.device) -> torch.device:
    return device if args.data_on == "device" else torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("plain", "ddp", "tidal"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--quick", action="store_true", help="the tiny version of the model")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--data-on",
        choices=("device", "cpu"),
        default="device",
        help="where the dataset's tensors live (cpu: each batch is copied to the device)",
    )
    parser.add_argument("--warmup", type=int, default=None, help="steps not timed")
    parser.add_argument("--steps", type=int, default=None, help="steps timed")
    parser.add_argument("--windows", type=int, default=5, help="timing windows")
    parser.add_argument("--sync-steps", type=int, default=20, help="steps whose syncs count")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", required=True, help="write the JSON result here")
    parser.add_argument("--profile", default=None, help="write a cProfile of the timed steps")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    spec = workload(args.model, args.quick)
    args.warmup = spec.warmup if args.warmup is None else args.warmup
    args.steps = spec.steps if args.steps is None else args.steps
    args.windows = max(1, min(args.windows, args.steps))
    run = {"plain": run_plain, "ddp": run_ddp, "tidal": run_tidal}[args.mode]
    started = time.perf_counter()
    rank, meter, device, params = run(args, spec)
    if rank != 0:
        return
    result = {
        "mode": args.mode,
        "model": args.model,
        "params": params,
        "batch": spec.batch,
        "warmup": args.warmup,
        "steps": args.steps,
        "data_on": args.data_on,
        "sync_every": os.environ.get("TIDAL_SYNC_EVERY") if args.mode == "tidal" else None,
        "run_s": time.perf_counter() - started,
        **meter.result(),
        **environment(device),
    }
    Path(args.result).write_text(json.dumps(result, indent=1))
    print(
        f"{args.mode} {args.model}: {result['ms_per_step']:.3f} ms/step "
        f"(windows {', '.join(f'{w:.3f}' for w in result['window_ms'])})"
        + (
            f"; {result['syncs_per_step']:.2f} host syncs/step"
            if "syncs_per_step" in result
            else ""
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
