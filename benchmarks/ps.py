"""Throughput of parameter-server training vs all-reduce on the benchmarks' 6.3M MLP.

Systems, all on this machine, one torch thread per process, gloo/ZeroMQ over loopback:

* ``allreduce``: plain ``DistributedDataParallel`` (gloo), the global batch split over the
  workers, one SGD step per global batch;
* ``ps-sync``: ``tidal.ps`` sync mode, ``replicas_to_aggregate`` = workers, each worker the
  same share of the global batch (the same math as all-reduce);
* ``ps-async``: ``tidal.ps`` async mode, each worker pushing its share as it is done.

at 2 and 4 workers, 1 and 2 servers. Throughput = samples whose gradient was applied per
second, counted in the window where every worker of the run is past its warm-up. Each
server reports its CPU seconds and bytes moved (``ps-stats``), so the table shows where a
PS step's time goes: a worker moves the whole model twice per step (pull + push: 2 x 25 MB
for 6.3M fp32 parameters) where ring all-reduce moves 2(W-1)/W of it.

    nice -n 10 PYTHONPATH=src:. python benchmarks/ps.py --steps 12 --warmup 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "src"))
from synthetic_mlp import build_data, build_model  # noqa: E402

import tidal.ps  # noqa: E402
from tidal.ps.launch import preload_for_fork  # noqa: E402

LR = 0.02


def shares(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a global batch that ``rank`` of ``world`` computes."""
    base, extra = divmod(batch, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def worker_steps(args: argparse.Namespace, rank: int, world: int):  # type: ignore[no-untyped-def]
    """This worker's batches, step after step."""
    x, y = build_data(args.samples, 0).tensors
    lo, hi = shares(args.batch_size, world, rank)
    for step in range(args.steps + args.warmup):
        start = (step * args.batch_size) % (len(x) - args.batch_size)
        yield x[start + lo : start + hi], y[start + lo : start + hi]


def write_trace(out: Path, name: str, times: list[float], samples: int) -> None:
    (out / f"{name}.json").write_text(json.dumps({"times": times, "samples": samples}))


def allreduce_worker(args: argparse.Namespace, rank: int, world: int, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(build_model(args.params))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for x, y in worker_steps(args, rank, world):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        times.append(time.time())
    write_trace(out, f"w{rank}", times, len(x))
    dist.destroy_process_group()


def ps_job() -> None:
    """A process of a ``ps-*`` run (started by ``LocalCluster`` with this file)."""
    args = parse()
    torch.set_num_threads(1)
    model = tidal.ps.ParameterServerModel(
        build_model(args.params), lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9)
    )
    rank, world = model.spec.index, args.world
    loss_fn = nn.CrossEntropyLoss()
    times = []
    with model:
        for x, y in worker_steps(args, rank, world):
            loss_fn(model(x), y).backward()
            if model.push():
                times.append(time.time())
    write_trace(Path(args.out), f"w{rank}", times, len(x))
    print("worker-stats " + json.dumps(model.stats), flush=True)


def throughput(out: Path, world: int, warmup: int) -> float:
    """Applied samples per second while every worker is past its warm-up."""
    traces = [json.loads((out / f"w{r}.json").read_text()) for r in range(world)]
    t0 = max(t["times"][warmup - 1] for t in traces)
    t1 = min(t["times"][-1] for t in traces)
    count = sum(t["samples"] * sum(1 for s in t["times"] if t0 < s <= t1) for t in traces)
    return count / (t1 - t0) if t1 > t0 else float("nan")


def fork(target, *a) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            target(*a)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def run_allreduce(args: argparse.Namespace, world: int, out: Path) -> dict[str, Any]:
    pids = [fork(allreduce_worker, args, r, world, out) for r in range(world)]
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    assert codes == [0] * world, codes
    per_worker = 4 * sum(p.numel() for p in build_model(args.params).parameters())
    return {
        "samples_s": throughput(out, world, args.warmup),
        "bytes_per_worker_step": 2 * (world - 1) / world * per_worker,
    }


def run_ps(args: argparse.Namespace, mode: str, world: int, n_ps: int, out: Path) -> dict[str, Any]:
    config = tidal.ps.PSConfig(
        n_ps=n_ps,
        mode=mode,
        max_workers=world,
        replicas_to_aggregate=world if mode == "sync" else None,
    )
    argv = [*sys.argv[1:], "--out", str(out), "--world", str(world)]
    with tidal.ps.LocalCluster(__file__, config, out / "job", args=argv) as cluster:
        cluster.start_servers()
        for i in range(world):
            cluster.start_worker(i)
        codes = cluster.wait_workers(timeout=args.timeout)
        assert set(codes.values()) == {0}, [p.output()[-3000:] for p in cluster.workers.values()]
        cluster.stop()
        servers = [
            json.loads(p.output().split("ps-stats ")[1].splitlines()[0])
            for p in cluster.servers.values()
        ]
        workers = [
            json.loads(p.output().split("worker-stats ")[1].splitlines()[0])
            for p in cluster.workers.values()
        ]
    steps = sum(w["pushes"] for w in workers)
    return {
        "samples_s": throughput(out, world, args.warmup),
        "bytes_per_worker_step": sum(w["bytes_pulled"] + w["bytes_pushed"] for w in workers)
        / steps,
        "server_cpu": [round(s["cpu_s"] / s["wall_s"], 2) for s in servers],
        # CPU a server spends per update it applies (receive, average, optimizer, send)
        "server_ms_per_update": [
            round(1000 * s["cpu_s"] / max(1, s["applied"]), 1) for s in servers
        ],
        "dropped": sum(w["dropped"] for w in workers),
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=float, default=6.3e6)
    parser.add_argument("--batch-size", type=int, default=96, help="global batch")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per worker")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--servers", default="1,2")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--trials", type=int, default=1, help="rounds over every system")
    parser.add_argument("--out", help="(a job process's trace directory)")
    parser.add_argument("--world", type=int, default=0, help="(a job process's worker count)")
    return parser.parse_args()


def main() -> None:
    args = parse()
    preload_for_fork()
    root = Path(tempfile.mkdtemp(prefix="ps-bench-"))
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows: list[dict[str, Any]] = []
    servers = [int(s) for s in args.servers.split(",")]
    for trial in range(args.trials):
        for world in (int(w) for w in args.workers.split(",")):
            runs = [("allreduce", 0)] + [(m, n) for m in ("ps-sync", "ps-async") for n in servers]
            for system, n_ps in runs:
                out = root / f"{system}-{world}-{n_ps}-{trial}"
                out.mkdir(parents=True)
                started = time.time()
                if system == "allreduce":
                    row = run_allreduce(args, world, out)
                else:
                    row = run_ps(args, system.split("-")[1], world, n_ps, out)
                row.update(
                    system=system,
                    workers=world,
                    servers=n_ps,
                    trial=trial,
                    wall=round(time.time() - started, 1),
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"load average after: {os.getloadavg()}\n")
    print(
        f"{'system':10} {'W':>2} {'PS':>2} {'samples/s':>10} {'vs all-reduce':>13}"
        f" {'MB/worker-step':>14}  server CPU ms/update  (medians of {args.trials} trials)"
    )
    configs = list(dict.fromkeys((r["system"], r["workers"], r["servers"]) for r in rows))

    def med(system: object, world: object, n_ps: object, key: str) -> float:
        return statistics.median(
            float(r[key])
            for r in rows
            if (r["system"], r["workers"], r["servers"]) == (system, world, n_ps)
        )

    for system, world, n_ps in configs:
        rate = med(system, world, n_ps, "samples_s")
        ratio = rate / med("allreduce", world, 0, "samples_s")
        mb = med(system, world, n_ps, "bytes_per_worker_step") / 1e6
        cpu = [
            r.get("server_ms_per_update")
            for r in rows
            if (r["system"], r["workers"], r["servers"]) == (system, world, n_ps)
        ]
        print(
            f"{system:10} {world:>2} {n_ps or '-':>2} {rate:>10.1f} {ratio:>13.2f}"
            f" {mb:>14.1f}  {cpu if system != 'allreduce' else ''}"
        )
    (root / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"\nresults: {root / 'results.json'}")


if __name__ == "__main__":
    if os.environ.get("TIDAL_PS_ROLE"):
        ps_job()
    else:
        main()
