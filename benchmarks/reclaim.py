"""Reclaiming a team's guarantee: by shrinking the borrower in place, beside evict-and-requeue.

A real ``tidal server`` (local backend, ``--slots 8``) with two team queues, ``a`` and
``b``, guaranteed 4 slots each. Each trial: a's elastic job (examples/digits_mlp.py,
``--workers 1:8``, a checkpoint every 20 steps) borrows all 8 slots; then b submits a job
of 4 workers. Team ``a`` gives its loan back either by **shrinking** its job to 4 at a step
boundary (tidal) or by **evict** (the job is stopped and requeued, restarting from its
checkpoint, as Kueue, KAI and Volcano take a loan back), alternating trial by trial.

* **to b's group**: from b's submission to b's agent forming its first group (all four
  workers joined; each starts its first step then), from the agent's log;
* **to b training**: from b's submission to b's first reported step (rank 0 reports every
  5 steps, so this includes up to 5 of b's steps);
* **a's lost steps**: steps a trained again after the reclaim (its step counter going
  back to its last checkpoint); **a's pause**: the longest gap between two of a's step
  reports from b's submission on (the rescale, or the eviction and restart).

Both modes run the same server: with ``--standby-workers N`` (default 4) its standby agent
keeps N warm interpreters, so b's 4 workers start warm; b is submitted once the standby
started after a's job took the first one is waiting (``0``: b's agent and workers start
cold, as before the standby).

    PYTHONPATH=src:. python benchmarks/reclaim.py --trials 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from common import ROOT
from tests.controller.live import start_server, stop_server, until

from tidal.client import Client

EXAMPLE = ROOT / "examples" / "digits_mlp.py"
MODES = ("shrink", "evict")
nan = float("nan")


def _spec(name: str, workers: dict[str, int], epochs: int) -> dict[str, Any]:
    return {
        "name": name,
        "team": name,
        "command": ["python", str(EXAMPLE), "--epochs", str(epochs), "--step-delay", "0.05"],
        "workers": workers,
        "checkpoint_every_steps": 20,
        # No job pool: b's first workers are the standby's, in both modes.
        "env": {"TIDAL_WARM_POOL": "0"},
    }


def _running(client: Client, job: str) -> int:
    return sum(w.state == "running" for w in client.get(job).worker_list)


def _second_standby_warm(data: Path) -> bool:
    """Whether the server's second standby agent waits with its pool warm (the first one
    took a's job: what it writes after that goes to a's agent log)."""
    log = data / "agents" / "standby.log"
    text = log.read_text() if log.exists() else ""
    return " interpreter(s) warm" in "".join(text.split("waiting for a job")[2:])


def _group_formed(agent_log: Path) -> float:
    """When (epoch seconds) the agent of ``agent_log`` formed its job's first group: its
    workers all joined and start their first step."""
    for line in agent_log.read_text().splitlines() if agent_log.exists() else ():
        if "generation 0 formed" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return nan


def trial(mode: str, tmp: Path, standby: int) -> dict[str, float]:
    """One reclaim by ``mode`` with a standby of ``standby`` interpreters; its figures."""
    teams = tmp / "teams.yaml"
    teams.write_text(
        f"teams:\n  - {{name: a, guaranteed: 4, reclaim: {mode}}}\n  - {{name: b, guaranteed: 4}}\n"
    )
    process = start_server(tmp, "--teams", str(teams), "--standby-workers", str(standby), slots=8)
    try:
        with Client(data_dir=tmp / "data", timeout=30) as client:
            a = client.submit(_spec("a", {"min": 1, "max": 8}, 400)).id
            until(lambda: _running(client, a) == 8, 300, "a on 8 workers")
            until(lambda: len(client.metrics(a)) >= 4, 120, "a training on 8")
            if standby:
                # a took the first standby: b gets the one started once a trained.
                until(lambda: _second_standby_warm(tmp / "data"), 300, "a second standby, warm")
            submitted = time.time()
            b = client.submit(_spec("b", {"min": 4, "max": 4}, 400)).id
            until(lambda: bool(client.metrics(b)), 300, "b training")
            first = min(m.time for m in client.metrics(b))
            b_log = tmp / "data" / "agents" / f"{b}.agent.log"
            # Whether b's agent was the standby (its first workers then were its pool's).
            warm = float("standby agent" in b_log.read_text()) if b_log.exists() else nan
            formed = _group_formed(b_log) - submitted
            try:
                # a back at work after the reclaim: a few reports after b's first.
                until(
                    lambda: sum(m.time > first for m in client.metrics(a)) >= 3,
                    300,
                    "a training",
                )
            except AssertionError as exc:
                # A borrower that never trains again is a result too: say how it ended.
                view = client.get(a)
                print(f"{mode}: {exc}; a is {view.state}: {view.reason}", file=sys.stderr)
                return {
                    "to_b_training": first - submitted,
                    "a_lost_steps": nan,
                    "a_pause": nan,
                    "b_from_standby": warm,
                    "to_b_group": formed,
                }
            points = sorted(client.metrics(a), key=lambda m: m.time)
        lost, top = 0, 0
        for point in points:
            if point.step < top:
                lost += top - point.step
            top = max(top, point.step)
        after = [p.time for p in points if p.time >= submitted]
        gaps = [later - earlier for earlier, later in itertools.pairwise(after)]
        return {
            "to_b_training": first - submitted,
            "a_lost_steps": float(lost),
            "a_pause": max(gaps, default=float("nan")),
            "b_from_standby": warm,
            "to_b_group": formed,
        }
    finally:
        stop_server(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2, help="trials per mode")
    parser.add_argument("--modes", default=",".join(MODES), help="shrink,evict or one")
    parser.add_argument(
        "--standby-workers", type=int, default=4, help="the server's standby (0: none)"
    )
    args = parser.parse_args()
    if args.standby_workers < 0:
        parser.error("--standby-workers: expected a whole number >= 0")
    modes = tuple(m for m in args.modes.split(",") if m in MODES)
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for i in range(args.trials):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            with tempfile.TemporaryDirectory(prefix=f"reclaim-{mode}-") as tmp:
                figures = trial(mode, Path(tmp), args.standby_workers)
            results[mode].append(figures)
            print(f"trial {i + 1} {mode}: {figures}", file=sys.stderr, flush=True)
    print("| median over trials | shrink (tidal) | evict (baseline) | ratio |")
    print("|---|---:|---:|---:|")
    for key, label in (
        ("to_b_group", "b's submission → b's workers joined, training (s)"),
        ("to_b_training", "b's submission → b's first report, step 5 (s)"),
        ("a_pause", "a's longest pause (s)"),
        ("a_lost_steps", "a's lost steps"),
    ):
        shrink = statistics.median(r[key] for r in results.get("shrink", [{key: nan}]))
        evict = statistics.median(r[key] for r in results.get("evict", [{key: nan}]))
        ratio = f"{shrink / evict:.2f}" if evict else "-"
        print(f"| {label} | {shrink:.2f} | {evict:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
