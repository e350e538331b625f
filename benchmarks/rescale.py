"""Rescale stall: tidal vs torchrun, on examples/synthetic_mlp.py's ~6.3M-parameter MLP.

Each trial runs one job per system through the same script of events:

* grow 2 -> 3, then crash: SIGKILL of a worker that is not rank 0 while 3 train, then
  (once 3 train again) planned shrink 3 -> 2;
* tidal: ``tidal run --workers 1:3 --initial 2 --timeout 10 --sync-every 1``, resized
  with ``tidal resize RUN --workers N``; after the crash the 2 survivors go on, and the
  launcher's replacement worker joins them when it has started ("regrow after crash");
* torchrun: one ``torchrun --nnodes=1:4 --nproc-per-node=1`` agent per worker on a c10d
  rendezvous, the script (benchmarks/torchrun_mlp.py) checkpointing every step and resuming
  at start; grow = start one more agent, shrink = SIGTERM that agent, crash = SIGKILL a worker
  (its agent restarts it, so the world stays 3).

**Stall** of an event, from rank 0's step trace (one line per committed step, stamped when
its optimizer update is done): the time between the end of the last step at the old size
and the end of the first step at the new size (for torchrun: of the first step of the
restarted processes), minus the median step time at the new size (over the next 10 steps).
So it is the time lost, beyond the step that would have happened anyway. **Redone** counts
committed steps computed again after the event (steps done after the last checkpoint).

    PYTHONPATH=src:. python benchmarks/rescale.py --trials 3 --out /tmp/rescale

``--crash-kills N`` measures instead the crash stall over N kills at random points of the
step, on 4 workers, for both systems in the same run (see benchmarks/rescale_crash.py):

    PYTHONPATH=src:. python benchmarks/rescale.py --crash-kills 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rescale_crash
from common import (
    BASELINE,
    EXAMPLE,
    PYTHON,
    TORCHRUN,
    Proc,
    Timeout,
    Trace,
    cleanup,
    env,
    free_port,
    measure,
    median,
    steady,
    wait_until,
)

EVENTS = ("grow", "crash", "shrink")
STEADY = 8  # steps at the new size before the next event
WAIT = 90.0  # bound on any one wait, seconds


def script_args(args: argparse.Namespace, trace: Path) -> list[str]:
    return [
        "--params",
        str(args.params),
        "--batch-size",
        str(args.batch_size),
        "--samples",
        str(args.batch_size * 128),
        "--steps",
        "1000000",
        "--trace",
        str(trace),
    ]


def tidal_trial(args: argparse.Namespace, work: Path, trial: int) -> list[dict[str, Any]]:
    trace = Trace(work / "trace")
    run_id = f"bench-rescale-{trial}-{int(time.time())}"
    environ = env(TIDAL_HOME=str(work / "home"))
    launcher = Proc(
        [
            PYTHON,
            "-m",
            "tidal.cli",
            "run",
            "--workers",
            "1:3",
            "--initial",
            "2",
            "--run-id",
            run_id,
            "--timeout",
            str(args.timeout),
            "--sync-every",
            str(args.sync_every),
            "--",
            EXAMPLE,
            *script_args(args, work / "trace"),
        ],
        work / "launcher.log",
        environ,
    )
    procs = [launcher]

    def workers() -> dict[str, int]:
        """Worker id -> pid, from the launcher's ``wN started on slot ... (pid P)``."""
        out = {}
        for line in launcher.lines:
            if " started on slot " in line and "(pid " in line:
                wid = line.split("started:", 1)[-1].split()[0]
                out[wid] = int(line.rsplit("(pid ", 1)[1].rstrip(")"))
        return out

    def resize(n: int) -> None:
        done = Proc(
            [PYTHON, "-m", "tidal.cli", "resize", run_id, "--workers", str(n)],
            work / "resize.log",
            environ,
        )
        done.popen.wait(timeout=60)
        done.stop()

    def formed(since: int) -> float | None:
        """The launcher's ``generation N formed ... in X ms`` after line ``since``, in s."""
        for line in launcher.lines[since:]:
            if " formed with " in line and line.endswith(" ms"):
                return float(line.rsplit(" in ", 1)[1][:-3]) / 1e3
        return None

    rows: list[dict[str, Any]] = []
    with cleanup(procs, lambda: set(workers().values())):
        wait_until(lambda: steady(trace, 2, STEADY, 0), WAIT, "2 workers training")
        world = 2
        for event in EVENTS:
            now, seen = time.time(), len(launcher.lines)
            if event == "grow":
                resize(3)
                world = 3
            elif event == "shrink":
                resize(2)
                world = 2
            else:
                last = trace.rank0()[-1]
                members = sorted(
                    {
                        str(d["worker"])
                        for d in trace.refresh()
                        if float(d["t"]) > float(last["t"]) - 1
                    }
                    - {str(last["worker"])},
                    key=lambda w: int(w[1:]),
                )
                victim = members[-1]
                os.kill(workers()[victim], signal.SIGKILL)
                wait_until(lambda n=now: steady(trace, 2, 3, n), WAIT, "survivors training")
                rows.append(
                    {
                        "event": event,
                        "formed": formed(seen),
                        **measure(trace.rank0(), now, ("world",)),
                    }
                )
                event, now, world = "regrow after crash", time.time(), 3
                seen = len(launcher.lines)
            wait_until(
                lambda w=world, n=now: steady(trace, w, STEADY, n),
                WAIT,
                f"{world} workers training",
            )
            rows.append(
                {"event": event, "formed": formed(seen), **measure(trace.rank0(), now, ("world",))}
            )
    return rows


def torchrun_trial(args: argparse.Namespace, work: Path, trial: int) -> list[dict[str, Any]]:
    trace = Trace(work / "trace")
    port = free_port()
    environ = env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)

    def agent(name: str, host: bool) -> Proc:
        return Proc(
            [
                TORCHRUN,
                "--nnodes=1:4",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=bench{trial}",
                "--rdzv-conf",
                f"last_call_timeout=1,is_host={int(host)}",
                "--max-restarts",
                "3",
                BASELINE,
                *script_args(args, work / "trace"),
                "--timeout",
                str(args.timeout),
                "--checkpoint",
                str(ckpt),
            ],
            work / f"agent-{name}.log",
            environ,
        )

    procs = [agent("a", True)]
    rows: list[dict[str, Any]] = []
    with cleanup(procs, trace.pids):
        time.sleep(0.5)
        procs.append(agent("b", False))
        wait_until(lambda: steady(trace, 2, STEADY, 0, key="worker"), WAIT, "2 agents training")
        extra: Proc | None = None
        for event in EVENTS:
            now = time.time()
            if event == "grow":
                extra = agent(f"g{len(procs)}", False)
                procs.append(extra)
                world = 3
            elif event == "shrink":
                assert extra is not None
                extra.signal(signal.SIGTERM)
                world = 2
            else:
                last = trace.refresh()[-1]
                recent = [d for d in trace.lines if float(d["t"]) > float(last["t"]) - 1]
                victim = max(int(d["pid"]) for d in recent if d["rank"] != 0)
                os.kill(victim, signal.SIGKILL)
                world = 3
            wait_until(
                lambda w=world, n=now: steady(trace, w, STEADY, n, key="worker"),
                WAIT,
                f"{world} workers training",
            )
            rows.append({"event": event, **measure(trace.rank0(), now, ("world", "worker"))})
    return rows


def summarize(results: dict[str, list[list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for system, trials in results.items():
        for trial in trials:
            for row in trial:
                name = str(row["event"])
                entry = table.setdefault(name, {}).setdefault(system, {"stall": [], "redone": []})
                entry["stall"].append(row["stall"])
                entry["redone"].append(row["redone"])
    return table


def crash_mode(args: argparse.Namespace, out: Path, systems: list[str]) -> None:
    """Many kills at random points of the step; each system's stall distribution."""
    runs = {"tidal": rescale_crash.tidal_crashes, "torchrun": rescale_crash.torchrun_crashes}
    results: dict[str, list[dict[str, float]]] = {}
    for system in systems:
        work = out / f"crash-{system}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        print(f"{system}: {args.crash_kills} kills (logs in {work})", flush=True)
        try:
            results[system] = runs[system](args, work, args.crash_kills)
        except TimeoutError as exc:
            print(f"{system}: {exc}", file=sys.stderr)
    rescale_crash.report(results)
    (out / "crash.json").write_text(json.dumps(results, indent=1))
    print(f"details: {out}/crash.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--params", type=float, default=6.3e6)
    parser.add_argument("--batch-size", type=int, default=96)
    parser.add_argument("--timeout", type=float, default=10.0, help="tidal --timeout, gloo timeout")
    parser.add_argument("--sync-every", type=int, default=1, help="tidal --sync-every")
    parser.add_argument("--systems", default="tidal,torchrun")
    parser.add_argument("--out", help="keep logs, traces and results.json here")
    parser.add_argument(
        "--crash-kills", type=int, default=0, help="crash mode: this many random-point kills"
    )
    parser.add_argument("--crash-params", type=float, default=1e6, help="crash mode model size")
    parser.add_argument("--seed", type=int, default=0, help="crash mode: victims, kill points")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidal-rescale-"))
    out.mkdir(parents=True, exist_ok=True)
    systems = args.systems.split(",")
    if args.crash_kills:
        crash_mode(args, out, systems)
        return
    trials = {"tidal": tidal_trial, "torchrun": torchrun_trial}
    results: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in systems}
    started = time.time()
    for trial in range(args.trials):
        for system in systems:
            work = out / f"{system}-{trial}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            t0 = time.time()
            try:
                rows = trials[system](args, work, trial)
            except Timeout as exc:
                print(f"{system} trial {trial}: {exc} (logs in {work})", file=sys.stderr)
                continue
            results[system].append(rows)
            print(f"{system} trial {trial} ({time.time() - t0:.0f}s):", flush=True)
            for row in rows:
                print(
                    f"  {row['event']:>18} {row['from']}->{row['to']} at step {row['step']}: "
                    f"gap {row['gap']:.3f}s step {row['step_time']:.3f}s "
                    f"stall {row['stall']:.3f}s redone {row['redone']}"
                    + (f" | runtime switch {row['switch']:.3f}s" if row.get("switch") else "")
                    + (f" | launcher formed {row['formed']:.3f}s" if row.get("formed") else ""),
                    flush=True,
                )
    table = summarize(results)
    print(f"\nmedians over trials ({time.time() - started:.0f}s in all):")
    print(f"{'event':<24}{'tidal':>10}{'torchrun':>10}{'ratio':>8}{'redone':>8}  n")
    for name, row in table.items():
        tidal = median(row.get("tidal", {}).get("stall", []))
        torchrun = median(row.get("torchrun", {}).get("stall", []))
        redone = median(row.get("torchrun", {}).get("redone", []))
        n = "/".join(str(len(row.get(s, {}).get("stall", []))) for s in systems)
        print(
            f"{name:<24}{tidal:>10.3f}{torchrun:>10.3f}{torchrun / tidal:>8.1f}{redone:>8.0f}  {n}"
        )
    (out / "results.json").write_text(json.dumps({"trials": results, "summary": table}, indent=1))
    print(f"details: {out}/results.json")


if __name__ == "__main__":
    main()
