"""Time to a target test accuracy on digits: the adaptive batch size against a sweep of
fixed batch sizes, same worker count (2 by default).

Each configuration runs ``benchmarks/digits_tta.py`` under ``tidal run --workers W``
(SGD + momentum, lr 0.05 tuned at batch 64; the adaptive run starts at ``--init-batch``
and scales the learning rate by AdaScale). The figure is seconds from the first step until
the test accuracy, checked every 5 steps, reaches the target; the median over trials.
The summary says where autoscale lands between the best and the worst fixed choice.

    PYTHONPATH=src:. python benchmarks/adaptive_time_to_accuracy.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, ROOT, Proc, cleanup, env, median

WORKER = str(ROOT / "benchmarks" / "digits_tta.py")


def run_one(
    args: argparse.Namespace, work: Path, batch: int, autoscale: int
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
        "--target",
        str(args.target),
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
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--fixed", default="16,32,64,128,256,512", help="fixed batch sizes")
    parser.add_argument("--init-batch", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--run-timeout", type=float, default=600.0)
    parser.add_argument("--out", help="keep logs and results.json here")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-tta-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    configs = [(f"fixed-{b}", b, 0) for b in map(int, args.fixed.split(","))]
    configs.append(("autoscale", args.init_batch, args.max_batch))
    runs: dict[str, list[dict[str, float | None]]] = {name: [] for name, _, _ in configs}
    for trial in range(args.trials):
        for name, batch, autoscale in configs if trial % 2 == 0 else configs[::-1]:
            work = out / f"{name}-{trial}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            got = run_one(args, work, batch, autoscale)
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
    fixed = {k: v for k, v in times.items() if k != "autoscale"}
    best = min(fixed, key=lambda k: fixed[k])
    worst = max(fixed, key=lambda k: fixed[k])
    mine = times["autoscale"]
    print("median seconds to target:", {k: round(v, 2) for k, v in times.items()})
    position = (
        (mine - fixed[best]) / (fixed[worst] - fixed[best]) if fixed[worst] > fixed[best] else 0.0
    )
    print(
        f"autoscale {mine:.1f} s; best fixed {best} {fixed[best]:.1f} s "
        f"(autoscale / best {mine / fixed[best]:.2f}); worst fixed {worst} {fixed[worst]:.1f} s "
        f"(worst / autoscale {fixed[worst] / mine:.2f}); position between best (0) and "
        f"worst (1): {position:.2f}",
        flush=True,
    )
    print(f"({time.time() - started:.0f}s in all)", file=sys.stderr)
    (out / "results.json").write_text(json.dumps({"runs": runs, "median_seconds": times}, indent=1))


if __name__ == "__main__":
    main()
