"""Time to a target test accuracy: the adaptive batch size against a sweep of fixed batch
sizes, same worker count (2 by default), on an offline dataset: ``teacher`` (seeded inputs
labelled by a random linear teacher; the default) or ``digits``.

Each configuration runs ``benchmarks/tta_worker.py`` under ``tidal run --workers W``
(SGD + momentum, lr 0.05; the adaptive run starts at ``--init-batch`` and scales the
learning rate by AdaScale). The figure is seconds from the first step until
the test accuracy, checked every 5 steps, reaches the target; the median over trials.
The summary says where autoscale lands between the best and the worst fixed choice.

    PYTHONPATH=src:. python benchmarks/adaptive_time_to_accuracy.py --trials 3
    PYTHONPATH=src:. python benchmarks/adaptive_time_to_accuracy.py --dataset digits --target 0.97
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, ROOT, Proc, cleanup, env, median

WORKER = str(ROOT / "benchmarks" / "tta_worker.py")


def run_one(
    args: argparse.Namespace, work: Path, batch: int, autoscale: int, rule: str
) -> dict[str, float | None]:
    result = work / "result.json"
    argv = [
        PYTHON,
        "-m",
        "tidal.cli",
        "run",
        "--workers",
        str(args.workers),
        "--",
        WORKER,
        "--batch-size",
        str(batch),
        "--autoscale",
        str(autoscale),
        "--lr-rule",
        rule,
        "--target",
        str(args.target),
        "--hidden",
        str(args.hidden),
        "--dataset",
        args.dataset,
        "--max-epochs",
        str(args.max_epochs),
        "--result",
        str(result),
    ]
    proc = Proc(argv, work / "run.log", env(TIDAL_HOME=str(work / "home")))
    with cleanup([proc], lambda: set()):
        code = proc.popen.wait(timeout=args.run_timeout)
    if code != 0 or not result.exists():
        raise RuntimeError(f"run failed ({code}); see {work / 'run.log'}")
    return dict(json.loads(result.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dataset", choices=("digits", "teacher"), default="teacher")
    parser.add_argument("--max-epochs", type=int, default=4, help="give up after this many")
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width")
    parser.add_argument("--fixed", default="32,128,512,1024", help="fixed batch sizes")
    parser.add_argument("--init-batch", type=int, default=32)
    parser.add_argument(
        "--rules", default="auto,sqrt", help="learning-rate rules of the autoscale runs"
    )
    parser.add_argument("--max-batch", type=int, default=2048)
    parser.add_argument("--run-timeout", type=float, default=600.0)
    parser.add_argument("--out", help="keep logs and results.json here")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-tta-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    configs = [(f"fixed-{b}", b, 0, "auto") for b in map(int, args.fixed.split(","))]
    rules = args.rules.split(",")
    for rule in rules:
        configs.append((f"autoscale-{rule}", args.init_batch, args.max_batch, rule))
    runs: dict[str, list[dict[str, float | None]]] = {name: [] for name, *_ in configs}
    for trial in range(args.trials):
        for name, batch, autoscale, rule in configs if trial % 2 == 0 else configs[::-1]:
            work = out / f"{name}-{trial}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            got = run_one(args, work, batch, autoscale, rule)
            runs[name].append(got)
            print(
                f"trial {trial} {name:>10}: "
                + (f"{got['seconds']:.1f} s" if got["seconds"] is not None else "not reached")
                + f", {got['steps']} steps, final batch {got['final_batch']}",
                flush=True,
            )
    times: dict[str, float] = {}
    for name, results in runs.items():
        reached = [float(r["seconds"]) for r in results if r["seconds"] is not None]
        times[name] = median(reached) if len(reached) == len(results) else float("inf")
    fixed = {k: v for k, v in times.items() if k.startswith("fixed-")}
    best = min(fixed, key=lambda k: fixed[k])
    worst = max(fixed, key=lambda k: fixed[k])
    print("median seconds to target:", {k: round(v, 2) for k, v in times.items()})
    for what in ("steps", "samples"):
        counts = {k: median([float(r[what] or 0) for r in v]) for k, v in runs.items()}
        print(f"median {what}:", {k: int(v) for k, v in counts.items()})
    for rule in rules:
        mine = times[f"autoscale-{rule}"]
        span = fixed[worst] - fixed[best]
        position = (mine - fixed[best]) / span if math.isfinite(span) and span > 0 else None
        print(
            f"autoscale ({rule}) {mine:.1f} s; best fixed {best} {fixed[best]:.1f} s "
            f"(autoscale / best {mine / fixed[best]:.2f}); worst fixed {worst} "
            f"{fixed[worst]:.1f} s; rank among the fixed choices: "
            f"{sum(v < mine for v in fixed.values()) + 1} of {len(fixed) + 1}"
            + (f"; position best (0) .. worst (1): {position:.2f}" if position is not None else ""),
            flush=True,
        )
    print(f"({time.time() - started:.0f}s in all)", file=sys.stderr)
    (out / "results.json").write_text(json.dumps({"runs": runs, "median_seconds": times}, indent=1))


if __name__ == "__main__":
    main()
