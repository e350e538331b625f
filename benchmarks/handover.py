"""Slot handover: from the controller's decision to the receiving job's new worker training.

A real ``tidal server`` (local backend, ``--slots 4``, fair share) runs two jobs of
tests/scripts/elastic_digits.py (``--workers 1:4``, ``--step-delay``), which share the
slots 2 / 2. Each trial raises the second job's priority (weights 1 : 2 → 1 / 3) or puts
it back (→ 2 / 2), so one slot moves from one job to the other.

* **decision**: the time of the first ``rescale`` event the controller recorded after the
  trial's request (the shrink of the job that gives the slot);
* **first step**: the first step line the receiving job's new worker wrote (each line is
  stamped with ``time.time()`` once its optimizer update is done);
* **handover** = first step − decision; **cold start** = the new worker's process start
  (from /proc) → its first step, in the same trial; **spawn** = decision → process start;
  **slot free** = decision → the next ``rescale`` event (the grow, which the controller
  decides once the released worker's process has exited and its slot is free).

By default each job keeps the warm pool a job that can grow gets (two interpreters), and
the server keeps its standby agent of 4 warm interpreters for the next job's first workers
(what ``tidal server --slots 4`` keeps by default on a host with the memory for them);
``--warm-pool 0`` measures cold starts, ``--warm-pool N`` N warm interpreters per job
(``TIDAL_WARM_POOL``), ``--standby-workers N`` the standby's size (``0``: none). With a pool
the new worker's process then started before the decision, so its "cold start" is the
pool's age, and the handover is what counts.

    PYTHONPATH=src:. python benchmarks/handover.py --trials 6 --out /tmp/handover
    PYTHONPATH=src:. python benchmarks/handover.py --trials 6 --warm-pool 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, env
from tests.controller.live import start_server, stop_server

from tidal.client import Client

SCRIPT = ROOT / "tests" / "scripts" / "elastic_digits.py"


def _spec(name: str, out: Path, step_delay: float, warm_pool: int | None) -> dict[str, Any]:
    return {
        "env": {} if warm_pool is None else {"TIDAL_WARM_POOL": str(warm_pool)},
        "name": name,
        "command": [
            "python",
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            "1000",
            "--dtype",
            "float32",
            "--step-delay",
            str(step_delay),
        ],
        "workers": {"min": 1, "max": 4},
    }


def _first_lines(out: Path) -> dict[str, dict[str, float]]:
    """Each worker's first step line (its ``time`` and ``started``), by file name."""
    first: dict[str, dict[str, float]] = {}
    for path in out.glob("steps-*.jsonl"):
        with open(path) as fh:
            line = fh.readline()
        if line.endswith("\n"):
            first[path.name] = json.loads(line)
    return first


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _running(client: Client, job: str) -> int:
    return sum(w.state == "running" for w in client.get(job).worker_list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--warm-pool",
        type=int,
        default=None,
        help="warm interpreters per job (0: cold starts; default: tidal's default pool)",
    )
    parser.add_argument(
        "--standby-workers",
        type=int,
        default=4,
        help="the server's standby agent's warm interpreters (default: the server's default "
        "for 4 slots; 0: no standby)",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra server args")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="tidal-handover-"))
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ.update(env())
    # The test helper starts servers without a standby; the last option given wins.
    standby = ("--standby-workers", str(args.standby_workers))
    process = start_server(base, *standby, *args.server_arg, slots=4)
    rows: list[tuple[float, float, float]] = []
    frees: list[float] = []
    try:
        with Client(data_dir=base / "data", timeout=30) as client:
            outs = {n: base / n for n in ("a", "b")}
            for out in outs.values():
                out.mkdir()
            a = client.submit(_spec("a", outs["a"], args.step_delay, args.warm_pool)).id
            _wait(lambda: _running(client, a) == 4, 120, "job a on 4 slots")
            b = client.submit(_spec("b", outs["b"], args.step_delay, args.warm_pool)).id
            _wait(lambda: _running(client, a) == 2 and _running(client, b) == 2, 120, "2 / 2")
            ids = {a: "a", b: "b"}
            for trial in range(args.trials):
                time.sleep(2.0)  # both jobs settled and training
                gaining = b if trial % 2 == 0 else a
                before = {n: set(_first_lines(o)) for n, o in outs.items()}
                last_event = max((e.id for e in client.events(limit=1000)), default=0)
                client.priority(b, 10000 if trial % 2 == 0 else 5000)
                out = outs[ids[gaining]]
                _wait(
                    lambda out=out, old=before[ids[gaining]]: set(_first_lines(out)) - old,
                    120,
                    "the receiving job's new worker's first step",
                )
                new = sorted(set(_first_lines(out)) - before[ids[gaining]])
                line = _first_lines(out)[new[0]]
                events = [
                    e
                    for e in client.events(limit=1000)
                    if e.id > last_event and e.kind == "rescale"
                ]
                times = sorted(e.time for e in events)
                decision = times[0]
                free = times[1] - decision if len(times) > 1 else float("nan")
                frees.append(free)
                handover = line["time"] - decision
                cold = line["time"] - line["started"]
                spawn = line["started"] - decision
                rows.append((handover, cold, spawn))
                print(
                    f"trial {trial}: {ids[gaining]} gains a slot: handover {handover:.2f}s "
                    f"(slot free {free:.2f}s, decision → process start {spawn:.2f}s, "
                    f"cold start {cold:.2f}s)",
                    flush=True,
                )
    finally:
        stop_server(process)
    load = os.getloadavg()
    handovers, colds, spawns = zip(*rows, strict=True)
    print(
        f"handover decision → first step: p50 {statistics.median(handovers):.2f}s "
        f"max {max(handovers):.2f}s | slot free p50 {statistics.median(frees):.2f}s "
        f"max {max(frees):.2f}s | decision → process start p50 "
        f"{statistics.median(spawns):.2f}s | cold start (process start → first step) p50 "
        f"{statistics.median(colds):.2f}s max {max(colds):.2f}s | {len(rows)} trials | "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


if __name__ == "__main__":
    main()
