"""REST API latency: submit and list under concurrent clients on loopback.

The server runs in its own process (so the clients' event loop does not share its GIL),
with a backend and policy that do nothing: this measures the API and the store, not jobs.
Baseline: ``GET /health`` at the same concurrency, the HTTP + framework floor; each
operation's ratio to it is what the API and the store add.

    PYTHONPATH=src python -m benchmarks.api --clients 50 --requests 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import httpx

from tidal.controller.routes.auth import read_token
from tidal.launch.api import JobLaunch, JobStatus
from tidal.policy.api import Allocation, Cluster, JobRequest, Slot
from tidal.wire.discovery import read_server_info

ROOT = Path(__file__).resolve().parents[1]


class NullBackend:
    """Runs nothing and reports nothing."""

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Do nothing."""

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Do nothing."""

    def stop(self, job_id: str) -> None:
        """Do nothing."""

    def poll(self) -> Mapping[str, JobStatus]:
        """No jobs."""
        return {}

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """No logs."""
        return {}

    def close(self) -> None:
        """Do nothing."""


class NullPolicy:
    """Allocates nothing: every job stays queued, so the store only grows."""

    name = "null"

    def allocate(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, tuple[Slot, ...]]:
        """No slots for anyone."""
        return {}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


async def phase(
    url: str,
    token: str,
    clients: int,
    per_client: int,
    request: Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]],
) -> tuple[list[float], float]:
    """Latencies (s) of ``clients`` concurrent clients each sending ``per_client`` requests,
    and the phase's wall time."""
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    # One connection per client, as separate users' CLIs and SDKs would have; one shared
    # pool of 50 connections measures the client library's pool more than the server.
    https = [
        httpx.AsyncClient(
            base_url=url, headers=headers, timeout=60.0, limits=httpx.Limits(max_connections=1)
        )
        for _ in range(clients)
    ]
    try:
        # Untimed first request per client: connection setup is not what is measured.
        await asyncio.gather(*(http.get("/health") for http in https))

        async def one_client(c: int) -> None:
            for i in range(per_client):
                start = time.perf_counter()
                response = await request(https[c], c * per_client + i)
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()

        began = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in range(clients)))
        return latencies, time.perf_counter() - began
    finally:
        await asyncio.gather(*(http.aclose() for http in https))


def start_server(data_dir: Path) -> subprocess.Popen[bytes]:
    """``tidal server`` with the null backend and policy; returns once it answers."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tidal.cli", "server", "--slots", "8",
            "--data-dir", str(data_dir), "--backend", "benchmarks.api:NullBackend",
            "--policy", "benchmarks.api:NullPolicy",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while read_server_info(data_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("server did not start")
        time.sleep(0.05)
    return proc


def main() -> None:
    """Run the benchmark and print p50/p99 per operation and the ratio to the baseline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20, help="per client and operation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        proc = start_server(data_dir)
        try:
            info = read_server_info(data_dir)
            token = read_token(data_dir)
            assert info is not None and token is not None

            def submit(http: httpx.AsyncClient, i: int) -> Awaitable[httpx.Response]:
                spec = {"name": f"bench-{i}", "command": ["python", "train.py"], "workers": "1:4"}
                return http.post("/jobs", json=spec)

            def list_jobs(http: httpx.AsyncClient, i: int) -> Awaitable[httpx.Response]:
                return http.get("/jobs", params={"state": "queued", "limit": 100})

            def health(http: httpx.AsyncClient, i: int) -> Awaitable[httpx.Response]:
                return http.get("/health")

            results = {}
            for label, request in (("health", health), ("submit", submit), ("list", list_jobs)):
                results[label] = asyncio.run(
                    phase(info.url, token, args.clients, args.requests, request)
                )
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    base = statistics.median(results["health"][0])
    load = os.getloadavg()[0]
    print(
        f"{args.clients} concurrent clients x {args.requests} requests each, loopback; "
        f"{os.cpu_count()} cores, load average {load:.1f} at the end"
    )
    print(f"{'op':<8}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'p50 / health p50':>19}")
    for label, (latencies, wall) in results.items():
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        rate = len(latencies) / wall
        ratio = p50 / base
        print(f"{label:<8}{p50 * 1e3:>9.1f}{p99 * 1e3:>9.1f}{rate:>9.0f}{ratio:>18.2f}x")


if __name__ == "__main__":
    main()
