"""What the adaptive batch size's bookkeeping costs: samples/s with autoscale on (gradient
statistics, timings, model fits, reports; the batch held fixed) against plain DDP and
against tidal without autoscale, same model, data, global batch and world (2).

* ``ddp``: ``torchrun ... benchmarks/torchrun_mlp.py`` (DistributedDataParallel);
* ``tidal``: ``tidal run --workers 2 -- examples/synthetic_mlp.py``;
* ``autoscale``: the same with ``--autoscale BATCH`` (``max_global`` = the batch: every
  statistic is gathered and reported, the batch never changes, so the work per step is
  the same as the others').

Throughput = global batch / median step time of rank 0 after a warm-up (as in
``benchmarks/overhead.py``). Trials rotate the order of the systems; the ratios reported
are of the medians over trials, and the medians of the per-trial ratios. CPU time per step
(summed over the workers) is printed too: it is much less sensitive to other users' load.

    PYTHONPATH=src:. python benchmarks/adaptive_overhead.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import Proc, Trace, cleanup, median
from overhead import cpu_per_step, job_command, throughput

SYSTEMS = ("ddp", "tidal", "autoscale")


def run_one(system: str, args: argparse.Namespace, work: Path) -> tuple[float, float]:
    """Run to the end; returns (samples/s from the median step, worker CPU s per step)."""
    trace_dir = work / "trace"
    # With autoscale, the script gathers every statistic; max_global = the batch keeps the
    # work per step the same.
    extra = ["--autoscale", str(args.batch_size)] if system == "autoscale" else []
    argv, environ = job_command(system, args, work)
    argv += extra
    trace = Trace(trace_dir)
    proc = Proc(argv, work / "run.log", environ)
    with cleanup([proc], lambda: set()):
        code = proc.popen.wait(timeout=args.run_timeout)
        if code != 0:
            raise RuntimeError(f"{system} exited with {code}; see {work / 'run.log'}")
    rate, _ = throughput(trace, args.batch_size, args.warmup)
    cpu, _ = cpu_per_step(trace, args.warmup, [])
    return rate, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--params", type=float, default=6.3e6)
    parser.add_argument("--batch-size", type=int, default=96)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps not counted")
    parser.add_argument("--run-timeout", type=float, default=180.0)
    parser.add_argument("--out", help="keep logs, traces and results.json here")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-adaptive-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rates: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    cpus: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    vs_ddp, vs_tidal = [], []
    for trial in range(args.trials):
        order = SYSTEMS[trial % 3 :] + SYSTEMS[: trial % 3]
        got: dict[str, float] = {}
        for system in order:
            work = out / f"{system}-{trial}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            rate, cpu = run_one(system, args, work)
            got[system] = rate
            rates[system].append(rate)
            cpus[system].append(cpu)
            print(
                f"trial {trial} {system:>9}: {rate:7.1f} samples/s; "
                f"worker CPU {cpu * 1e3:.1f} ms/step",
                flush=True,
            )
        vs_ddp.append(got["autoscale"] / got["ddp"])
        vs_tidal.append(got["autoscale"] / got["tidal"])
    m = {s: median(rates[s]) for s in SYSTEMS}
    c = {s: median(cpus[s]) for s in SYSTEMS}
    summary = {
        "rates": rates,
        "cpu_per_step": cpus,
        "autoscale_over_ddp": m["autoscale"] / m["ddp"],
        "autoscale_over_ddp_paired_median": median(vs_ddp),
        "autoscale_over_tidal": m["autoscale"] / m["tidal"],
        "autoscale_over_tidal_paired_median": median(vs_tidal),
        "tidal_over_ddp": m["tidal"] / m["ddp"],
        "cpu_ddp_over_autoscale": c["ddp"] / c["autoscale"],
        "cpu_tidal_over_autoscale": c["tidal"] / c["autoscale"],
    }
    print(
        f"samples/s (median of {args.trials}): DDP {m['ddp']:.1f}, tidal {m['tidal']:.1f}, "
        f"tidal+autoscale {m['autoscale']:.1f}\n"
        f"autoscale / DDP {summary['autoscale_over_ddp']:.3f} (paired median "
        f"{summary['autoscale_over_ddp_paired_median']:.3f}); autoscale / tidal "
        f"{summary['autoscale_over_tidal']:.3f} (paired median "
        f"{summary['autoscale_over_tidal_paired_median']:.3f}); tidal / DDP "
        f"{summary['tidal_over_ddp']:.3f}\n"
        f"worker CPU ms/step: DDP {c['ddp'] * 1e3:.1f}, tidal {c['tidal'] * 1e3:.1f}, "
        f"autoscale {c['autoscale'] * 1e3:.1f}",
        flush=True,
    )
    print(f"({time.time() - started:.0f}s in all)", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
