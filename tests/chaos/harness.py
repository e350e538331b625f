"""What the chaos suite drives: a real ``tidal server`` it can SIGKILL and start again on
the same data dir, a prober that watches every answer the API gives, and a scan of the
processes the run left.

Every process of a run carries one token in its environment (``TIDAL_CHAOS_RUN``): the
server is started with it and everything the server starts (agents, workers, what they
start) inherits it, so the scan finds them even after a ``setsid``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

#: The environment variable that marks every process of one chaos run.
RUN_TOKEN = "TIDAL_CHAOS_RUN"


def until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true and return that; fail after
    ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), ``None`` once it is
    gone or a zombie: with the pid, it names one process even if the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def marked_processes(token: str) -> list[int]:
    """Live processes whose environment carries ``RUN_TOKEN=token``."""
    needle = f"{RUN_TOKEN}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in environ and start_time(int(entry)) is not None:
            found.append(int(entry))
    return found


@dataclass
class SeenProcesses:
    """Every process the run saw (pid and start time), to prove none outlived it."""

    seen: dict[tuple[int, int], str] = field(default_factory=dict)

    def add(self, pid: int | None, what: str) -> None:
        """Remember ``pid`` (if it still runs) as ``what``."""
        if pid:
            started = start_time(pid)
            if started is not None:
                self.seen.setdefault((pid, started), what)

    def alive(self) -> list[str]:
        """The seen processes that still run (the same process: pid and start time)."""
        return [
            f"{what} (pid {pid})"
            for (pid, started), what in self.seen.items()
            if start_time(pid) == started
        ]


class ChaosServer:
    """``tidal server`` (local backend) on a data dir, SIGKILLed and started again at will."""

    def __init__(self, root: Path, token: str, slots: int) -> None:
        self.root = root
        self.data = root / "data"
        self.token = token
        self.slots = slots
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        """Where every start of the server writes its log."""
        return self.root / "server.log"

    def start(self) -> None:
        """Start the server and wait until it answers ``/health``."""
        (self.data / "server.json").unlink(missing_ok=True)
        self.starts += 1
        with open(self.log, "a") as log:
            log.write(f"--- start {self.starts}\n")
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tidal.cli", "server"),
                    *("--slots", str(self.slots), "--data-dir", str(self.data)),
                    *("--standby-workers", "0"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=dict(os.environ, TIDAL_HOME=str(self.root / "home"), **{RUN_TOKEN: self.token}),
            )
        process = self.process

        def serving() -> bool:
            assert process.poll() is None, f"server exited at start ({process.returncode})"
            url = self.url()
            if url is None:
                return False
            try:
                return httpx.get(f"{url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        until(serving, 90, "the server to serve")

    def url(self) -> str | None:
        """The running server's URL, from its ``server.json``."""
        try:
            return str(json.loads((self.data / "server.json").read_text())["url"])
        except (OSError, ValueError, KeyError):
            return None

    def kill(self) -> None:
        """SIGKILL the server process alone (its agents and workers go on)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """A clean stop (SIGINT: jobs are released, agents end), SIGKILL past a deadline."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def api(self) -> httpx.Client:
        """A client for the current server with the admin token."""
        url = self.url()
        assert url is not None, "no server running"
        token = (self.data / "token").read_text().strip()
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@dataclass
class Answer:
    """One answer the prober got that is not allowed: a 5xx."""

    route: str
    status: int
    body: str


class Prober:
    """Asks the API for every kind of page, over and over, while faults happen: any 5xx
    is recorded (connection errors are not: the server is down between a kill and its
    restart)."""

    ROUTES = ("/health", "/jobs", "/jobs?view=full", "/events", "/cluster", "/progress")

    def __init__(self, server: ChaosServer, job_ids: Callable[[], list[str]]) -> None:
        self.server = server
        self.job_ids = job_ids
        self.bad: list[Answer] = []
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def _routes(self) -> Iterator[str]:
        k = 0
        while True:
            yield self.ROUTES[k % len(self.ROUTES)]
            for job in self.job_ids():
                yield (f"/jobs/{job}", f"/jobs/{job}/events", f"/jobs/{job}/logs?tail=5")[k % 3]
            k += 1

    def _run(self) -> None:
        routes = self._routes()
        while not self._stop.wait(0.05):
            route = next(routes)
            try:
                with self.server.api() as client:
                    response = client.get(route)
            except (httpx.HTTPError, AssertionError, OSError):
                continue  # the server is down or starting
            self.answered += 1
            if response.status_code >= 500:
                self.bad.append(Answer(route, response.status_code, response.text[:500]))

    @contextmanager
    def running(self) -> Iterator[Prober]:
        """Probe until the block ends."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=60)
