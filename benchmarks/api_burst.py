"""Requests applied under a launch storm: 300 short jobs on 4 slots, then cancels of most.

A real ``tidal server`` (local backend: an agent process per job) on 127.0.0.1 with
``--slots`` slots. ``--jobs`` jobs that exit at once are submitted together; while the
server launches them, ``--rate`` requests a second are sent: a cancel of most queued jobs
(newest first), and a few priority changes and scale requests (jobs of ``1:2`` workers
scaled to 2). A watcher polls ``GET /jobs?since=`` (only the jobs that changed) and takes
a request as applied when a poll shows it carried out (at the call's return at the
earliest): no longer pending, and the job showing what was asked (``cancelled``, the priority, the
target). A cancel of a job that ended first is never applied ("lost"). Printed: p50/p99/max of that
latency, requests never applied, and the launch rate (``started`` events a second while
the burst launches).

The baseline sends the same requests to an idle server: its jobs ask for more slots than
there are (``slots + 1`` workers), so nothing is launched. The ratio is burst p99 over
idle p99.

``--tree`` runs the server from another checkout's sources (two releases in one run)::

    git archive integ | tar -x -C /tmp/before
    PYTHONPATH=src python -m benchmarks.api_burst --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.api import percentile
from tidal.controller.routes.auth import read_token
from tidal.wire.discovery import read_server_info


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)])}


def start_server(tree: Path, data_dir: Path, slots: int) -> subprocess.Popen[bytes]:
    """``tidal server`` from ``tree`` with the local backend, once it answers."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tidal.cli", "server", "--slots", str(slots),
            "--data-dir", str(data_dir),
        ],
        env=_env(tree),
        stdout=subprocess.DEVNULL,
        stderr=open(data_dir.parent / "server.log", "ab"),  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while read_server_info(data_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("server did not start")
        time.sleep(0.05)
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the server stops its jobs), SIGKILL of its session if it hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Asked:
    """A request whose call returned at ``at`` (perf counter); ``field`` of the job's
    view is ``value`` once it is carried out (no view before the request shows it)."""

    job_id: str
    request_id: int
    at: float
    field: str
    value: Any


@dataclass
class Watcher:
    """Polls the jobs that changed; keeps ``(began, done, view)`` of every job seen."""

    http: httpx.Client
    seen: list[tuple[float, float, dict[str, Any]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    polls: int = 0

    def run(self) -> None:
        cursor = self.http.get("/jobs", params={"limit": 1}).headers["X-Change-Cursor"]
        while not self.stop.is_set():
            began = time.perf_counter()
            answer = self.http.get("/jobs", params={"since": cursor, "limit": 1000})
            done = time.perf_counter()
            answer.raise_for_status()
            cursor = answer.headers["X-Change-Cursor"]
            self.seen.extend((began, done, view) for view in answer.json())
            self.polls += 1
            time.sleep(0.01)

    def applied_at(self, asked: Asked) -> float | None:
        """When a poll first showed the request carried out: the job showing the
        requested value (no view before the request does) with the request no longer
        pending; the call's return if that poll answered earlier (a poll may answer
        between the server's answer and the client's reading it, and its cursor hides
        the change from the polls after it)."""
        for _, done, view in self.seen:
            if view["id"] != asked.job_id:
                continue
            if any(p["id"] == asked.request_id for p in view["pending_requests"]):
                continue
            if view[asked.field] != asked.value:
                continue
            return max(done, asked.at)
        return None


@dataclass(frozen=True)
class Trial:
    """What one server did with the requests."""

    name: str
    latencies: list[float]
    unapplied: int
    refused: int
    launched: int
    launch_rate: float
    load: float


def trial(tree: Path, name: str, jobs: int, slots: int, rate: float, idle: bool) -> Trial:
    """Submit ``jobs``, send the requests, measure; ``idle``: jobs that never launch."""
    with tempfile.TemporaryDirectory(prefix="tidal-burst-") as tmp:
        data = Path(tmp) / "data"
        server = start_server(tree, data, slots)
        try:
            return _measure(data, name, jobs, slots, rate, idle)
        finally:
            stop_server(server)


def _measure(data: Path, name: str, jobs: int, slots: int, rate: float, idle: bool) -> Trial:
    info = read_server_info(data)
    assert info is not None
    headers = {"Authorization": f"Bearer {read_token(data)}"}
    http = httpx.Client(base_url=info.url, headers=headers, timeout=120)
    watch = httpx.Client(base_url=info.url, headers=headers, timeout=120)
    wide = slots + 1  # more than the cluster has: never launched
    # Every tenth job may be scaled: 1:2 workers (idle: wide:wide+1).
    scalable = set(range(5, jobs, 10))
    ids: list[str] = []
    for i in range(jobs):
        spec: dict[str, Any] = {"name": f"burst-{i}", "command": ["/bin/true"]}
        low = wide if idle else 1
        spec["workers"] = f"{low}:{low + 1}" if i in scalable else low
        answer = http.post("/jobs", json=spec)
        answer.raise_for_status()
        ids.append(answer.json()["id"])
    watcher = Watcher(watch)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    # Newest first: those are still queued when their request comes.
    plan: list[tuple[str, int]] = []
    for i in reversed(range(jobs // 6, jobs)):
        if i in scalable:
            plan.append(("scale", i))
        elif i % 25 == 7:
            plan.append(("priority", i))
        else:
            plan.append(("cancel", i))
    asked: list[Asked] = []
    refused = applied_first = 0
    began = time.perf_counter()
    for n, (kind, i) in enumerate(plan):
        time.sleep(max(0.0, began + n / rate - time.perf_counter()))
        job = ids[i]
        field: str
        value: Any
        if kind == "cancel":
            answer = http.post(f"/jobs/{job}/cancel")
            field, value = "state", "cancelled"
        elif kind == "priority":
            field, value = "priority", 5  # jobs are submitted at the default, 5000
            answer = http.put(f"/jobs/{job}/priority", json={"priority": value})
        else:
            field, value = "target_slots", (wide if idle else 1) + 1
            answer = http.post(f"/jobs/{job}/scale", json={"workers": value})
        at = time.perf_counter()
        if answer.status_code >= 400:
            refused += 1  # e.g. the job ended first: nothing to apply
            continue
        view = answer.json()
        pending = [p["id"] for p in view["pending_requests"]]
        if not pending and view[field] == value:
            # Applied before the answer was made (an idle server): no poll after the call
            # would show the job again, and it waited for nothing.
            applied_first += 1
            continue
        asked.append(Asked(job, max(pending, default=-1), at, field, value))
    # Every request gets 120 s to be applied (those that never are, are counted).
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        if all(watcher.applied_at(a) is not None for a in asked):
            break
        time.sleep(0.5)
    watcher.stop.set()
    thread.join(timeout=30)
    latencies = [0.0] * applied_first
    for a in asked:
        done = watcher.applied_at(a)
        if done is not None:
            latencies.append(done - a.at)
    events = http.get("/events", params={"limit": 10000}).json()
    starts = sorted(e["time"] for e in events if e["kind"] == "started")
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    http.close()
    watch.close()
    return Trial(
        name=name,
        latencies=latencies,
        unapplied=len(asked) + applied_first - len(latencies),
        refused=refused,
        launched=len(starts),
        launch_rate=(len(starts) - 1) / span if span > 0 else 0.0,
        load=os.getloadavg()[0],
    )


def _row(t: Trial) -> str:
    ms = [x * 1000 for x in t.latencies] or [float("nan")]
    return (
        f"{t.name:<28} {len(t.latencies):>5} {percentile(ms, 50):>8.0f} {percentile(ms, 99):>8.0f}"
        f" {max(ms):>8.0f} {t.unapplied:>5} {t.refused:>5} {t.launched:>6}"
        f" {t.launch_rate:>7.2f} {t.load:>5.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the burst and the idle baseline (``--trials`` times each), print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rate", type=float, default=10.0, help="requests a second")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--tree", type=Path, action="append", help="checkout to run")
    args = parser.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parents[1]]
    print(
        f"{args.jobs} jobs (/bin/true) on {args.slots} slots; requests at {args.rate:g}/s: "
        "cancels of most queued jobs, a few priority and scale requests"
    )
    print(
        f"{'server':<28} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'lost':>5}"
        f" {'409':>5} {'starts':>6} {'start/s':>7} {'load':>5}"
    )
    for tree in trees:
        burst: list[float] = []
        idle: list[float] = []
        for _ in range(args.trials):
            for is_idle in (False, True):
                name = f"{tree.name or tree} {'idle' if is_idle else 'burst'}"
                t = trial(tree, name, args.jobs, args.slots, args.rate, is_idle)
                print(_row(t), flush=True)
                p99 = percentile(t.latencies, 99) if t.latencies else float("inf")
                (idle if is_idle else burst).append(p99)
        b, i = statistics.median(burst), statistics.median(idle)
        print(f"{tree}: p99 burst {b * 1000:.0f} ms / idle {i * 1000:.0f} ms = {b / i:.1f}x")


if __name__ == "__main__":
    main()
