"""Resize cost: the torchrun launcher's restart against the tidal launcher's in-place rescale.

One run measures both launchers of ``tidal run`` on the same small model (the digits MLP,
64-32-10, SGD, global batch 64, float32):

* **tidal**: ``tidal run --workers 1:3`` of tests/scripts/elastic_digits.py (the tidal
  runtime): a resize is a new generation, formed in place at a step boundary;
* **torchrun**: ``tidal run --launcher torchrun --workers 1:3`` of tests/scripts/
  torchrun_ddp.py (plain DDP, its own checkpoint after every step): a resize stops every
  worker (SIGTERM) and starts them all again, and the script resumes from its checkpoint.

Each trial starts a run on 3 workers, waits for it to train, then shrinks it to 2 and
grows it back to 3, waiting for steady steps in between. **Cost** of a resize = the end of
rank 0's first step at the new size − the moment the resize was requested (through the
run's store, as ``tidal resize`` does): the time from the decision to training at the new
size. **Stall** = the longest gap between rank 0's steps (at any size) from its last step
before the decision to its first at the new size, minus the step time at the new size (the
median of its next steps): how long training stopped. A tidal grow keeps training at the
old size while the newcomer starts, so its cost can be long while its stall is short; a
torchrun restart stops training for all of it.

    PYTHONPATH=src:. python benchmarks/resize_cost.py --trials 3 --out /tmp/resize-cost
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PYTHON, ROOT, Proc, Timeout, Trace, cleanup, env, median, wait_until

from tidal.launch.runs import lookup
from tidal.runtime.rendezvous import connect_store, request_resize

TIDAL_SCRIPT = str(ROOT / "tests" / "scripts" / "elastic_digits.py")
TORCHRUN_SCRIPT = str(ROOT / "tests" / "scripts" / "torchrun_ddp.py")
WAIT = 180.0  # bound on any one wait, seconds
STEADY = 8  # steps at a size before the next resize
_PID = re.compile(r"started on slot \S+ \(pid (\d+)\)")


def rank0_steps(out: Path) -> list[tuple[float, int]]:
    """``(time, world)`` of every step rank 0 recorded, oldest first, whichever script."""
    if not out.exists():
        return []
    if any(out.glob("steps-*.jsonl")):  # elastic_digits.py: one file per worker
        lines = []
        for path in out.glob("steps-*.jsonl"):
            for raw in path.read_text().splitlines():
                if raw.endswith("}"):
                    d = json.loads(raw)
                    if d["rank"] == 0:
                        lines.append((float(d["time"]), int(d["world"])))
        return sorted(lines)
    return [(float(d["t"]), int(d["world"])) for d in Trace(out).rank0()]


def after(out: Path, mark: float, world: int) -> list[float]:
    """End times of rank 0's steps at ``world`` since ``mark``."""
    return [t for t, w in rank0_steps(out) if t > mark and w == world]


def trial(launcher: str, args: argparse.Namespace, work: Path, n: int) -> list[dict[str, Any]]:
    """One run of ``launcher``: start at 3, shrink to 2, grow to 3; one row per resize."""
    out = work / "steps"
    out.mkdir(parents=True)
    run_id = f"bench-resize-{launcher}-{n}-{int(time.time())}"
    environ = env(TIDAL_HOME=str(work / "home"), OMP_NUM_THREADS="1")
    delay = str(args.step_delay)
    if launcher == "tidal":
        script = [TIDAL_SCRIPT, "--out", str(out), "--epochs", "100000", "--dtype", "float32"]
        script += ["--step-delay", delay]
    else:
        script = [TORCHRUN_SCRIPT, "--checkpoint", str(work / "ckpt.pt"), "--steps", "10000000"]
        script += ["--trace", str(out / "trace.jsonl"), "--step-delay", delay]
    command = [PYTHON, "-m", "tidal.cli", "run", "--launcher", launcher, "--workers", "1:3"]
    command += ["--run-id", run_id, "--", *script]
    launcher_proc = Proc(command, work / "launcher.log", environ)

    def pids() -> set[int]:
        return {int(m[1]) for line in launcher_proc.lines if (m := _PID.search(line))}

    rows: list[dict[str, Any]] = []
    with cleanup([launcher_proc], pids):
        wait_until(lambda: len(after(out, 0, 3)) >= STEADY, WAIT, f"{launcher}: 3 training")
        # Where `tidal resize` finds the run (the launcher registered it before training).
        os.environ["TIDAL_HOME"] = environ["TIDAL_HOME"]
        record = lookup(run_id)
        assert record is not None, "the run did not register"
        host, _, port = record.store.rpartition(":")
        store = connect_store(host, int(port), timeout=30)
        for old, new in ((3, 2), (2, 3)):
            decision = time.time()
            request_resize(store, new)
            wait_until(
                lambda w=new, m=decision: len(after(out, m, w)) >= STEADY,
                WAIT,
                f"{launcher}: {new} training",
            )
            times = after(out, decision, new)
            step_time = median([b - a for a, b in itertools.pairwise(times)])
            # Training stopped for the longest gap between rank 0's steps (whatever their
            # size) from its last step before the decision to its first at the new size.
            every = [t for t, _ in rank0_steps(out)]
            window = [max(t for t in every if t <= decision)]
            window += [t for t in every if decision < t <= times[0]]
            longest = max(b - a for a, b in itertools.pairwise(window))
            rows.append(
                {
                    "launcher": launcher,
                    "resize": f"{old}->{new}",
                    "cost": times[0] - decision,
                    "stall": longest - step_time,
                    "step_time": step_time,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--step-delay", type=float, default=0.02, help="sleep in each step")
    parser.add_argument("--out", help="keep logs and results.json here")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-resize-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    started = time.time()
    for n in range(args.trials):
        for launcher in ("tidal", "torchrun"):
            work = out / f"{launcher}-{n}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            try:
                got = trial(launcher, args, work, n)
            except Timeout as exc:
                print(f"{launcher} trial {n}: {exc} (logs in {work})", file=sys.stderr)
                continue
            rows.extend(got)
            for row in got:
                print(
                    f"trial {n} {launcher:>8} {row['resize']}: cost {row['cost']:.3f}s "
                    f"stall {row['stall']:.3f}s (step {row['step_time']:.3f}s)",
                    flush=True,
                )
    print(f"\nmedians over {args.trials} trials ({time.time() - started:.0f}s in all):")
    print(f"{'resize':<8}{'measure':<8}{'tidal s':>10}{'torchrun s':>12}{'ratio':>8}  n")
    for resize in ("3->2", "2->3"):
        for measure in ("cost", "stall"):
            by_launcher = {
                launcher: [
                    float(r[measure])
                    for r in rows
                    if r["resize"] == resize and r["launcher"] == launcher
                ]
                for launcher in ("tidal", "torchrun")
            }
            tidal, torchrun = median(by_launcher["tidal"]), median(by_launcher["torchrun"])
            counts = f"{len(by_launcher['tidal'])}/{len(by_launcher['torchrun'])}"
            ratio = torchrun / tidal if tidal > 0 else float("inf")
            print(f"{resize:<8}{measure:<8}{tidal:>10.3f}{torchrun:>12.3f}{ratio:>8.1f}  {counts}")
    steps = median([float(r["step_time"]) for r in rows])
    print(f"median step time at the new size: {steps:.3f}s")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"details: {out}/results.json")


if __name__ == "__main__":
    main()
