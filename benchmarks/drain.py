"""Draining a host: time from the drain request to the host empty, and steps lost, beside
a checkpoint-and-restart evacuation of the same job in the same run (Ray Train's way).

The controller loop and API run in this process over the local backend, with two hosts
of two slots (``node-a``, ``node-b``; the local backend runs every worker here, the slots
name the host they belong to). One job of tests/scripts/elastic_digits.py (``2:4``
workers, ``--step-delay``) trains on all four slots.

* **tidal drain** (``--trials`` times): ``POST /cluster/hosts/node-a/drain`` with a 30 s
  deadline; **empty** = request → the cluster view shows no live worker on ``node-a``;
  **gap** = the longest time between two committed steps around the drain (training
  never stops); **lost** = steps committed twice (a rollback) or skipped. Then the host is
  undrained and the job grows back onto it.
* **checkpoint and restart** (as many times, same job, the loop stopped so that this
  script drives the backend): the job is given no slots (every worker leaves after rank 0
  writes a durable checkpoint), then restarted on ``node-b``'s slots from that checkpoint;
  **empty** = request → no live worker of the job; **gap** = last step before → first
  step after; **lost** = steps after the checkpoint (0: it is written at the request).

    PYTHONPATH=src:. python benchmarks/drain.py --trials 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common import ROOT

from tidal.backends.local import LocalBackend
from tidal.client import Client
from tidal.controller.cluster import ClusterHost, ClusterModel
from tidal.controller.loop.controller import Controller
from tidal.controller.routes.auth import ensure_token
from tidal.controller.store.jobs import JobStore
from tidal.policy.api import Slot
from tidal.policy.fairshare import FairSharePolicy
from tidal.server.app import create_app
from tidal.server.process import ApiServer

SCRIPT = ROOT / "tests" / "scripts" / "elastic_digits.py"
A: list[Slot] = [("node-a", 0), ("node-a", 1)]
B: list[Slot] = [("node-b", 0), ("node-b", 1)]


def _records(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(out.glob("steps-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                rows.append(json.loads(line))
    return rows


def _latest(out: Path) -> dict[str, Any] | None:
    rows = _records(out)
    return max(rows, key=lambda r: (r["step"], r["time"])) if rows else None


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _world(out: Path, size: int, since: float) -> bool:
    last = _latest(out)
    return last is not None and last["world"] == size and last["time"] > since


def _polled(backend: LocalBackend, out: Path, size: int, since: float) -> bool:
    """:func:`_world`, the backend polled first (nothing else drives it meanwhile)."""
    backend.poll()
    return _world(out, size, since)


def _gap(out: Path, t0: float) -> float:
    """The longest wait between two committed steps from the last step before ``t0`` on."""
    times = sorted({r["step"]: r["time"] for r in _records(out)}.items())
    start = max((i for i, (_, t) in enumerate(times) if t <= t0), default=0)
    span = [t for _, t in times[start:]]
    return max((b - a for a, b in itertools.pairwise(span)), default=0.0)


def _lost(out: Path) -> int:
    """Steps committed in more than one generation, or missing from the counter."""
    rows = [r for r in _records(out) if r.get("stepped", True)]
    gens: dict[int, set[int]] = {}
    for r in rows:
        gens.setdefault(r["step"], set()).add(r["gen"])
    twice = sum(1 for g in gens.values() if len(g) > 1)
    missing = len(set(range(1, max(gens) + 1)) - set(gens)) if gens else 0
    return twice + missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="tidal-drain-"))
    data, out = root / "data", root / "out"
    out.mkdir()
    token = ensure_token(data)
    store = JobStore.open(data)
    backend = LocalBackend(data)
    hosts = ClusterModel((ClusterHost("node-a", 2), ClusterHost("node-b", 2)))
    controller = Controller(store, hosts, FairSharePolicy(), backend, data)
    server = ApiServer(create_app(controller, token))
    server.start()
    controller.start(interval=0.2)
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--epochs", "100000"]
    command += ["--dtype", "float32", "--step-delay", str(args.step_delay)]
    drains: list[tuple[float, float]] = []
    restarts: list[tuple[float, float, int]] = []
    try:
        client = Client(url=server.url, token=token, timeout=30)
        job = client.submit({"name": "drained", "command": command, "workers": "2:4"}).id
        for trial in range(args.trials):
            _wait(lambda: _world(out, 4, 0.0), args.timeout, "four workers")
            t0 = time.time()
            client.drain("node-a", deadline=30)

            def empty() -> bool:
                host = next(h for h in client.cluster().hosts if h.name == "node-a")
                return host.draining is not None and host.draining.remaining == []

            _wait(empty, args.timeout, "node-a to empty")
            emptied = time.time() - t0
            _wait(partial(_world, out, 2, t0), args.timeout, "two workers")
            drains.append((emptied, _gap(out, t0)))
            print(f"drain {trial + 1}: empty {emptied:.2f}s gap {drains[-1][1]:.2f}s", flush=True)
            client.undrain("node-a")
        drain_lost = _lost(out)
        print(
            f"tidal drain: host empty p50 {_median(drains, 0):.2f}s, longest step gap p50 "
            f"{_median(drains, 1):.2f}s, steps lost {drain_lost}",
            flush=True,
        )

        # Ray Train's way: the loop stops, this script drives the same job's backend.
        controller.stop()
        for trial in range(args.trials):
            _wait(lambda: _polled(backend, out, 4, 0.0), args.timeout, "four workers")
            before = _latest(out)
            assert before is not None
            t0 = time.time()
            backend.assign(job, [])

            def gone() -> bool:
                status = backend.poll().get(job)
                return status is not None and not status.alive_slots()

            _wait(gone, args.timeout, "every worker to leave")
            left = time.time()
            emptied = left - t0
            last = _latest(out)
            assert last is not None
            backend.assign(job, B)
            _wait(partial(_polled, backend, out, 2, left), args.timeout, "the restart")
            # The first step of the restarted workers (every earlier one had left).
            after = min((r for r in _records(out) if r["time"] > left), key=lambda r: r["time"])
            gap = after["time"] - last["time"]
            lost = last["step"] - (after["step"] - 1)
            restarts.append((emptied, gap, lost))
            print(f"restart {trial + 1}: empty {emptied:.2f}s gap {gap:.2f}s lost {lost}")
            backend.assign(job, A + B)
    except TimeoutError as exc:
        print(f"stopped: {exc}", flush=True)
    finally:
        controller.stop()
        server.stop()
        backend.close()
        store.close()

    print(f"{len(drains)} drain(s), {len(restarts)} restart(s); data in {root}")
    if drains and restarts:
        print(
            f"checkpoint + restart: host empty p50 {_median(restarts, 0):.2f}s, training "
            f"stopped p50 {_median(restarts, 1):.2f}s, steps lost "
            f"{sum(r[2] for r in restarts)}"
        )
        print(
            f"ratio (restart / drain): host empty "
            f"{_median(restarts, 0) / _median(drains, 0):.2f}x, training stopped "
            f"{_median(restarts, 1) / _median(drains, 1):.2f}x"
        )


def _median(rows: list[Any], i: int) -> float:
    return float(statistics.median(r[i] for r in rows))


if __name__ == "__main__":
    main()
