"""REST API under load: 50 concurrent clients, a get/list/submit mix, 1,000 jobs stored.

A real ``tidal server`` in its own process on loopback, with a backend and a policy that
do nothing (every job stays queued, so the store only grows). The store is filled with
``--jobs`` jobs before the server starts; then ``--clients`` clients, one connection each,
send ``--requests`` requests each, every one picked at random among ``GET /jobs/{id}``,
``GET /jobs`` (what the CLI and the dashboard ask) and ``POST /jobs``. Reports p50/p99
per operation, the errors and the load average.

``--tree`` runs the server (and fills the store) from another checkout's sources, so two
releases compare in one run on the same machine::

    git archive integ | tar -x -C /tmp/before
    PYTHONPATH=src python -m benchmarks.api_load --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.api import percentile
from tidal.controller.routes.auth import read_token
from tidal.wire.discovery import read_server_info

OPS = ("get", "list", "submit")

_FILL = """
import sys
from pathlib import Path
from tidal.controller.store.jobs import JobStore
from tidal.spec import parse_spec
store = JobStore.open(Path(sys.argv[1]))
for i in range(int(sys.argv[2])):
    store.add_job(parse_spec({"name": f"stored-{i}", "command": ["python", "train.py"],
                              "workers": "1:4", "labels": {"batch": str(i % 10)}}))
print("\\n".join(j.id for j in store.list_jobs()))
store.close()
"""


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)])}


def fill_store(tree: Path, data_dir: Path, jobs: int) -> list[str]:
    """JobStore ``jobs`` queued jobs with ``tree``'s own store code; their ids."""
    done = subprocess.run(
        [sys.executable, "-c", _FILL, str(data_dir), str(jobs)],
        env=_env(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.split()


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(tree: Path, data_dir: Path) -> subprocess.Popen[bytes]:
    """``tidal server`` from ``tree`` with the null backend and policy, once it answers."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tidal.cli", "server", "--slots", "8",
            "--data-dir", str(data_dir), "--backend", "benchmarks.api:NullBackend",
            "--policy", "benchmarks.api:NullPolicy",
        ],
        env=_env(tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while read_server_info(data_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("server did not start")
        time.sleep(0.05)
    return proc


@dataclass(frozen=True)
class Mix:
    """What the clients saw: latencies (s) and error counts per operation, the wall time
    of the mix and the CPU time (s) the server and the clients' process used during it."""

    latencies: dict[str, list[float]]
    errors: dict[str, int]
    wall: float
    server_cpu: float
    client_cpu: float


async def mix(
    url: str,
    token: str,
    ids: list[str],
    clients: int,
    per_client: int,
    seed: int,
    server_pid: int | None = None,
) -> Mix:
    """``clients`` clients, one connection each, ``per_client`` requests each; the CPU
    of process ``server_pid`` is measured over the same time (0 without one)."""

    def server_cpu() -> float:
        return _cpu_seconds(server_pid) if server_pid is not None else 0.0

    latencies: dict[str, list[float]] = {op: [] for op in OPS}
    errors = dict.fromkeys(OPS, 0)
    headers = {"Authorization": f"Bearer {token}"}
    # One TLS context for all: each client would otherwise load the CA bundle (~20 ms of
    # CPU each, before the mix) for a plain-HTTP URL; one process needs one.
    tls = ssl.create_default_context()
    https = [
        httpx.AsyncClient(
            base_url=url,
            headers=headers,
            timeout=120.0,
            limits=httpx.Limits(max_connections=1),
            verify=tls,
        )
        for _ in range(clients)
    ]
    try:
        await asyncio.gather(*(http.get("/health") for http in https))

        async def one_client(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            for i in range(per_client):
                op = rng.choice(OPS)
                start = time.perf_counter()
                try:
                    if op == "get":
                        response = await https[c].get(f"/jobs/{rng.choice(ids)}")
                    elif op == "list":
                        response = await https[c].get("/jobs")
                    else:
                        spec = {"name": f"load-{c}-{i}", "command": ["python", "x.py"]}
                        response = await https[c].post("/jobs", json=spec)
                    ok = response.status_code < 400
                except httpx.HTTPError:
                    ok = False
                latencies[op].append(time.perf_counter() - start)
                errors[op] += 0 if ok else 1

        # CPU over the mix only, not while the clients are made (the clients' TLS setup).
        began, server, client = time.perf_counter(), server_cpu(), time.process_time()
        await asyncio.gather(*(one_client(c) for c in range(clients)))
        return Mix(
            latencies,
            errors,
            time.perf_counter() - began,
            server_cpu() - server,
            time.process_time() - client,
        )
    finally:
        await asyncio.gather(*(http.aclose() for http in https))


@dataclass(frozen=True)
class Figures:
    """One operation's figures in one trial."""

    p50_ms: float
    p99_ms: float
    errors: int
    count: int


@dataclass(frozen=True)
class Trial:
    """One trial: figures per operation, the size of ``GET /jobs``, the load average."""

    ops: dict[str, Figures]
    list_bytes: int
    load: float
    #: Requests answered per second, and the cores the server and the clients used.
    rate: float
    server_cpu: float
    client_cpu: float


def trial(tree: Path, jobs: int, clients: int, per_client: int, seed: int) -> Trial:
    """One run against a fresh server from ``tree``: per-op p50/p99 (ms) and errors."""
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        ids = fill_store(tree, data_dir, jobs)
        proc = start_server(tree, data_dir)
        try:
            info, token = read_server_info(data_dir), read_token(data_dir)
            assert info is not None and token is not None
            probe = httpx.get(f"{info.url}/jobs", headers={"Authorization": f"Bearer {token}"})
            size = len(probe.content)
            run = asyncio.run(mix(info.url, token, ids, clients, per_client, seed, proc.pid))
            latencies, errors, wall = run.latencies, run.errors, run.wall
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    ops = {
        op: Figures(
            percentile(latencies[op], 50) * 1e3,
            percentile(latencies[op], 99) * 1e3,
            errors[op],
            len(latencies[op]),
        )
        for op in OPS
    }
    total = sum(len(v) for v in latencies.values())
    return Trial(
        ops, size, os.getloadavg()[0], total / wall, run.server_cpu / wall, run.client_cpu / wall
    )


def main() -> None:
    """Run ``--trials`` trials per tree (alternating) and print medians per tree and op."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append", help="checkout(s) to compare")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs stored beforehand")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=12, help="per client")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [Path(__file__).resolve().parents[1]])]
    runs: dict[Path, list[Trial]] = {t: [] for t in trees}
    for n in range(args.trials):
        for tree in trees:
            runs[tree].append(trial(tree, args.jobs, args.clients, args.requests, seed=n))
    print(
        f"{args.jobs} jobs stored, {args.clients} clients x {args.requests} requests "
        f"(get/list/submit at random), loopback, {os.cpu_count()} cores; medians of "
        f"{args.trials} trial(s)"
    )
    print(f"{'tree':<28}{'op':<8}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'n':>6}")
    for tree, results in runs.items():
        for op in OPS:
            rows = [r.ops[op] for r in results]
            p50 = statistics.median(r.p50_ms for r in rows)
            p99 = statistics.median(r.p99_ms for r in rows)
            errs = sum(r.errors for r in rows)
            n = sum(r.count for r in rows)
            print(f"{tree.name[-27:]:<28}{op:<8}{p50:>9.1f}{p99:>9.1f}{errs:>8}{n:>6}")
        size = statistics.median(r.list_bytes for r in results)
        loads = ", ".join(f"{r.load:.1f}" for r in results)
        print(f"{'':<28}GET /jobs body {size / 1e3:.0f} kB; load average after each: {loads}")
        rate = statistics.median(r.rate for r in results)
        server = statistics.median(r.server_cpu for r in results)
        client = statistics.median(r.client_cpu for r in results)
        print(
            f"{'':<28}{rate:.0f} requests/s; cores busy: server {server:.2f}, clients "
            f"{client:.2f} (CPU ms per request: {server / rate * 1e3:.2f}, "
            f"{client / rate * 1e3:.2f})"
        )


if __name__ == "__main__":
    main()
