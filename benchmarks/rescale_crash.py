"""Crash stall over many kills at random points of the step: tidal vs torchrun.

``benchmarks/rescale.py --crash-kills N`` runs this. Each system trains
examples/synthetic_mlp.py's MLP (its torchrun twin for torchrun) on 4 workers; N times, once
4 train steadily, a worker other than rank 0 is SIGKILLed at a uniformly random moment of
a step (a random delay of up to one step time after rank 0 traced a step), so kills land
before, during and after the gradient all-reduce and at the step boundary.

* tidal (``tidal run --workers 1:4 --initial 4``): the 3 survivors go on; the launcher
  starts a replacement, which joins when it has started. **Stall** = end of the first
  step at world 3 - end of the last step at world 4 before it - the median step time
  at world 4 just before the kill.
* torchrun: the agent of the killed worker restarts the whole group from the last
  checkpoint (saved every step). **Stall** = end of the first step of the restarted
  processes - end of the last step of the old ones - the median step time before.

Prints p50, p95 and max of each system's stalls, and how many took longer than 2 s.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common import BASELINE, EXAMPLE, PYTHON, TORCHRUN, Proc, Trace, cleanup, env, free_port

WORLD = 4
WAIT = 120.0


def _script_args(args: argparse.Namespace, trace: Path) -> list[str]:
    return [
        "--params",
        str(args.crash_params),
        "--batch-size",
        str(args.batch_size),
        "--samples",
        str(args.batch_size * 128),
        "--steps",
        "1000000",
        "--trace",
        str(trace),
    ]


def _wait(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.01)


def _rank0_tail(trace: Trace, after: float) -> list[dict[str, Any]]:
    return [d for d in trace.rank0() if float(d["t"]) > after]


def _changed_since(trace: Trace, after: float, changed: Callable[[dict[str, Any]], bool]) -> bool:
    """Whether a line of rank 0's since ``after`` is ``changed``."""
    return any(changed(d) for d in _rank0_tail(trace, after))


def _left_world(line: dict[str, Any]) -> bool:
    """A step no longer at the full world (the survivors')."""
    return bool(line["world"] != WORLD)


def _pid_is_not(old: int, line: dict[str, Any]) -> bool:
    """A step of another rank-0 process than ``old`` (the restarted group's)."""
    return int(line["pid"]) != old


def _steady(trace: Trace, key: str, after: float, steps: int) -> bool:
    """Rank 0 traced ``steps`` steps at world 4 since ``after``, all in one configuration."""
    tail = _rank0_tail(trace, after)[-steps:]
    return (
        len(tail) == steps
        and all(d["world"] == WORLD for d in tail)
        and len({d[key] for d in tail}) == 1
    )


def _step_time(trace: Trace) -> float:
    lines = trace.rank0()[-8:]
    gaps = [float(b["t"]) - float(a["t"]) for a, b in itertools.pairwise(lines)]
    return statistics.median(gaps)


def _kill_at_random_point(trace: Trace, rng: random.Random, victim_pid: int) -> float:
    """Wait for rank 0's next step, then SIGKILL after a random part of a step."""
    step = _step_time(trace)
    seen = len(trace.rank0())
    _wait(lambda: len(trace.rank0()) > seen, "the next step")
    time.sleep(rng.uniform(0.0, step))
    now = time.time()
    os.kill(victim_pid, signal.SIGKILL)
    return now


def _stall(
    trace: Trace, killed_at: float, changed: Callable[[dict[str, Any]], bool], step: float
) -> dict[str, float]:
    lines = trace.rank0()
    first = next(d for d in lines if float(d["t"]) > killed_at and changed(d))
    before = [d for d in lines if float(d["t"]) < float(first["t"]) and not changed(d)]
    gap = float(first["t"]) - float(before[-1]["t"])
    return {"gap": gap, "step_time": step, "stall": gap - step}


def tidal_crashes(args: argparse.Namespace, work: Path, kills: int) -> list[dict[str, float]]:
    trace = Trace(work / "trace")
    rng = random.Random(args.seed)
    launcher = Proc(
        [
            PYTHON,
            "-m",
            "tidal.cli",
            "run",
            "--workers",
            f"1:{WORLD}",
            "--initial",
            str(WORLD),
            "--max-restarts",
            str(kills + 5),
            "--timeout",
            str(args.timeout),
            "--sync-every",
            str(args.sync_every),
            "--log-dir",
            str(work / "workers"),
            "--",
            EXAMPLE,
            *_script_args(args, work / "trace"),
        ],
        work / "launcher.log",
        env(TIDAL_HOME=str(work / "home"), TIDAL_LOG_LEVEL="INFO"),
    )

    def pids() -> dict[str, int]:
        out = {}
        for line in launcher.lines:
            if " started on slot " in line and "(pid " in line:
                wid = line.split("started:", 1)[-1].split()[0]
                out[wid] = int(line.rsplit("(pid ", 1)[1].rstrip(")"))
        return out

    rows: list[dict[str, float]] = []
    with cleanup([launcher], lambda: set(pids().values())):
        mark = 0.0
        for kill in range(kills):
            _wait(partial(_steady, trace, "world", mark, 6), f"{WORLD} workers training")
            step = _step_time(trace)
            recent = [d for d in trace.refresh()[-4 * WORLD :] if d["world"] == WORLD]
            victim = rng.choice(sorted({str(d["worker"]) for d in recent if d["rank"] != 0}))
            killed_at = _kill_at_random_point(trace, rng, pids()[victim])
            _wait(
                partial(_changed_since, trace, killed_at, _left_world),
                "the survivors' first step",
            )
            row = _stall(trace, killed_at, _left_world, step)
            rows.append(row)
            print(f"  tidal kill {kill + 1:>2} ({victim}): stall {row['stall']:.3f}s", flush=True)
            mark = killed_at
    return rows


def torchrun_crashes(args: argparse.Namespace, work: Path, kills: int) -> list[dict[str, float]]:
    trace = Trace(work / "trace")
    rng = random.Random(args.seed)
    port = free_port()
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    environ = env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")

    def agent(name: str, host: bool) -> Proc:
        return Proc(
            [
                TORCHRUN,
                f"--nnodes={WORLD}:{WORLD}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=crash",
                "--rdzv-conf",
                f"is_host={int(host)}",
                "--max-restarts",
                str(kills + 5),
                BASELINE,
                *_script_args(args, work / "trace"),
                "--timeout",
                str(args.timeout),
                "--checkpoint",
                str(ckpt),
            ],
            work / f"agent-{name}.log",
            environ,
        )

    procs = [agent("0", True)]
    rows: list[dict[str, float]] = []
    with cleanup(procs, trace.pids):
        time.sleep(0.5)
        procs.extend(agent(str(i), False) for i in range(1, WORLD))
        mark = 0.0
        for kill in range(kills):
            _wait(partial(_steady, trace, "pid", mark, 6), f"{WORLD} workers training")
            step = _step_time(trace)
            old = int(trace.rank0()[-1]["pid"])
            recent = trace.refresh()[-4 * WORLD :]
            victim = rng.choice(sorted({int(d["pid"]) for d in recent if d["rank"] != 0}))
            killed_at = _kill_at_random_point(trace, rng, victim)
            _wait(
                partial(_changed_since, trace, killed_at, partial(_pid_is_not, old)),
                "the restarted group's first step",
            )
            row = _stall(trace, killed_at, partial(_pid_is_not, old), step)
            rows.append(row)
            print(f"  torchrun kill {kill + 1:>2}: stall {row['stall']:.3f}s", flush=True)
            mark = killed_at
    return rows


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, interpolated linearly."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def report(results: dict[str, list[dict[str, float]]]) -> None:
    """Print each system's stall distribution."""
    print(f"\ncrash stall over random kill points (load average {os.getloadavg()}):")
    print(f"{'system':<10}{'kills':>6}{'p50':>8}{'p95':>8}{'max':>8}{'> 2s':>6}  stalls (s)")
    for system, rows in results.items():
        stalls = [r["stall"] for r in rows]
        slow = sum(s > 2.0 for s in stalls)
        print(
            f"{system:<10}{len(stalls):>6}{percentile(stalls, 0.5):>8.3f}"
            f"{percentile(stalls, 0.95):>8.3f}{max(stalls, default=float('nan')):>8.3f}"
            f"{slow:>6}  {' '.join(f'{s:.2f}' for s in sorted(stalls))}"
        )
