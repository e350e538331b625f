"""Steady-state throughput of tidal vs plain DDP: same model, data, global batch, world 2.

* tidal: ``tidal run --workers 2 [--sync-every K] -- examples/synthetic_mlp.py``
  (ElasticDataParallel + ElasticDataLoader + State.step() every step);
* DDP: ``torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d
  --rdzv-endpoint=127.0.0.1:PORT benchmarks/torchrun_mlp.py``
  (DistributedDataParallel, the same contiguous sharding of each global batch, no checkpoint).

Both are 2 local processes on gloo with 1 torch thread each. Throughput = global batch /
median step time over rank 0's traced steps after a warm-up (start-up and shut-down do not
count; the median resists bursts of load from other users of a shared machine; the plain
mean, batch x steps / elapsed, is kept in results.json too). Trials alternate the systems;
the ratio reported is tidal / DDP of the medians, and the median of the per-trial ratios.

    PYTHONPATH=src:. python benchmarks/overhead.py --trials 3 --sync-every 1,8
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import BASELINE, EXAMPLE, PYTHON, TORCHRUN, Proc, Trace, cleanup, env, free_port, median


def first_run(trace: Trace, world: int = 2) -> list[dict[str, Any]]:
    """The lines of the first ``world`` workers only: if the launcher restarts the job
    (see "Exit abort" in docs/benchmarks.md), the rerun's workers are not counted."""
    first: list[str] = []
    for d in trace.refresh():
        if d["worker"] not in first:
            first.append(str(d["worker"]))
    keep = set(first[:world])
    return [d for d in trace.lines if d["worker"] in keep]


def throughput(trace: Trace, batch: int, warmup: int) -> tuple[float, float]:
    """Samples/s after ``warmup`` steps: global batch / median step time (robust to the
    bursts of load other users put on a shared machine), and global batch x steps /
    elapsed (the plain mean)."""
    rank0 = [d for d in first_run(trace) if d["rank"] == 0]
    times = [float(d["t"]) for d in rank0[warmup:]]
    if len(times) < 2:
        return float("nan"), float("nan")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return batch / median(gaps), batch * len(gaps) / (times[-1] - times[0])


def cpu_per_step(
    trace: Trace, warmup: int, launcher: list[tuple[float, float]]
) -> tuple[float, float]:
    """CPU seconds per step after ``warmup``: summed over the workers (all their threads),
    and of the launcher (``tidal run`` / the torchrun agent) over the same steps. What a
    step costs the machine; much less sensitive to other users' load than time."""
    workers = 0.0
    mine = first_run(trace)
    for worker in {str(d["worker"]) for d in mine}:
        lines = [d for d in mine if d["worker"] == worker][warmup:]
        if len(lines) >= 2:
            workers += (float(lines[-1]["cpu"]) - float(lines[0]["cpu"])) / (len(lines) - 1)
    times = [float(d["t"]) for d in mine if d["rank"] == 0][warmup:]
    inside = [(t, c) for t, c in launcher if times[0] <= t <= times[-1]]
    own = float("nan")
    if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
        rate = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])  # CPU s per s
        own = rate * (times[-1] - times[0]) / (len(times) - 1)
    return workers, own


def job_command(
    system: str, args: argparse.Namespace, work: Path, tidal_options: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one run of the synthetic job: plain DDP under
    torchrun for ``"ddp"``, else ``tidal run`` with ``tidal_options`` before the script."""
    common = [
        "--params",
        str(args.params),
        "--batch-size",
        str(args.batch_size),
        "--samples",
        str(args.batch_size * 128),
        "--steps",
        str(args.steps),
        "--trace",
        str(work / "trace"),
    ]
    if system == "ddp":
        argv = [
            TORCHRUN,
            "--nnodes=1",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            BASELINE,
            *common,
        ]
        return argv, env(OMP_NUM_THREADS="1")
    argv = [PYTHON, "-m", "tidal.cli", "run", "--workers", "2", *tidal_options, "--"]
    return [*argv, EXAMPLE, *common], env(TIDAL_HOME=str(work / "home"))


def run_one(
    system: str, args: argparse.Namespace, work: Path, sync_every: int
) -> tuple[tuple[float, float], tuple[float, float], float]:
    """Run a job to its end; returns ((median-based, mean) samples/s, (workers', launcher's)
    CPU s per step, wall seconds)."""
    trace_dir = work / "trace"
    options = () if system == "ddp" else ("--sync-every", str(sync_every))
    argv, environ = job_command(system, args, work, options)
    trace = Trace(trace_dir)
    started = time.monotonic()
    proc = Proc(argv, work / "run.log", environ)
    samples = proc.sample_cpu()
    with cleanup([proc], lambda: set()):
        code = proc.popen.wait(timeout=args.run_timeout)
        if code != 0:
            raise RuntimeError(f"{system} exited with {code}; see {work / 'run.log'}")
    failed = [line for line in proc.lines if "failed:" in line and "exited with status" in line]
    for line in failed:
        print(f"  {system}: {line.strip()} (after training; see {work / 'run.log'})", flush=True)
    rates = throughput(trace, args.batch_size, args.warmup)
    return rates, cpu_per_step(trace, args.warmup, samples), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--params", type=float, default=6.3e6)
    parser.add_argument("--batch-size", type=int, default=96)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10, help="steps not counted")
    parser.add_argument("--sync-every", default="1", help="tidal --sync-every values, e.g. 1,8")
    parser.add_argument("--run-timeout", type=float, default=120.0)
    parser.add_argument("--out", help="keep logs, traces and results.json here")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    summary = {}
    for k in [int(v) for v in args.sync_every.split(",")]:
        rates: dict[str, list[float]] = {"tidal": [], "ddp": []}
        means: dict[str, list[float]] = {"tidal": [], "ddp": []}
        cpus: dict[str, list[float]] = {"tidal": [], "ddp": []}
        launchers: dict[str, list[float]] = {"tidal": [], "ddp": []}
        ratios = []
        for trial in range(args.trials):
            order = ("tidal", "ddp") if trial % 2 == 0 else ("ddp", "tidal")
            got = {}
            for system in order:
                work = out / f"sync{k}-{system}-{trial}"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                (rate, mean), (cpu, own), wall = run_one(system, args, work, k)
                got[system] = rate
                rates[system].append(rate)
                means[system].append(mean)
                cpus[system].append(cpu)
                launchers[system].append(own)
                print(
                    f"sync_every={k} trial {trial} {system:>5}: {rate:7.1f} samples/s "
                    f"(mean {mean:.1f}); CPU-ms/step: workers {cpu * 1e3:.1f}, "
                    f"launcher {own * 1e3:.1f}; {wall:.0f}s",
                    flush=True,
                )
            ratios.append(got["tidal"] / got["ddp"])
        tidal, ddp = median(rates["tidal"]), median(rates["ddp"])
        summary[k] = {
            "tidal": rates["tidal"],
            "ddp": rates["ddp"],
            "ratio_of_medians": tidal / ddp,
            "median_ratio": median(ratios),
            "mean_based": means,
            "mean_based_ratio_of_medians": median(means["tidal"]) / median(means["ddp"]),
            "cpu_per_step": cpus,
            "cpu_ratio_ddp_over_tidal": median(cpus["ddp"]) / median(cpus["tidal"]),
            "launcher_cpu_per_step": launchers,
        }
        print(
            f"sync_every={k}: tidal {tidal:.1f} samples/s, DDP {ddp:.1f} samples/s, "
            f"tidal/DDP {tidal / ddp:.3f} (median of per-trial ratios {median(ratios):.3f}); "
            f"CPU per step: tidal {median(cpus['tidal']) * 1e3:.1f} ms, "
            f"DDP {median(cpus['ddp']) * 1e3:.1f} ms, "
            f"DDP/tidal {median(cpus['ddp']) / median(cpus['tidal']):.3f}; launcher CPU per "
            f"step: tidal {median(launchers['tidal']) * 1e3:.1f} ms, "
            f"torchrun agent {median(launchers['ddp']) * 1e3:.1f} ms",
            flush=True,
        )
    print(f"({time.time() - started:.0f}s in all)", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
