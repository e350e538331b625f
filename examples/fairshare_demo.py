"""Two jobs sharing 8 slots, live: 8 → 4/4 → 3/5 (priority raised) → 8 (job 1 done).

Starts an embedded ``tidal server`` with 8 virtual CPU slots in a temporary folder, submits
two digits jobs through the Python SDK, raises the second job's priority mid-way, and draws
who holds which slot as it changes. Everything is stopped and removed at the end.

    python examples/fairshare_demo.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tidal.client import Client
from tidal.wire.schema import JobDetail, JobView

EXAMPLE = Path(__file__).resolve().parent / "digits_mlp.py"
COLOURS = ["cyan", "magenta", "green", "yellow"]
SLOTS = 8


def start_server(folder: Path) -> subprocess.Popen[bytes]:
    """An embedded server on 8 virtual slots; returns once it answers."""
    data = folder / "data"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "server",
            "--slots",
            str(SLOTS),
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "server.log", "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (data / "server.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start; see {folder / 'server.log'}")
        time.sleep(0.1)
    return process


def job_spec(name: str, epochs: int, folder: Path) -> dict[str, object]:
    """A digits job that may use 1 to 8 workers."""
    return {
        "name": name,
        "command": [
            "python",
            str(EXAMPLE),
            "--epochs",
            str(epochs),
            "--step-delay",
            "0.08",
            "--result",
            str(folder / f"{name}.json"),
        ],
        "workers": {"min": 1, "max": SLOTS},
    }


def render(client: Client, jobs: list[str], log: list[str]) -> Group:
    """Slots by job, the jobs' table and the last events."""
    views = {job: client.get(job) for job in jobs}
    owner: dict[int, int] = {}
    for i, view in enumerate(views.values()):
        for worker in view.worker_list:
            if worker.state == "running":
                owner[worker.slot] = i
    bar = Text("slots  ")
    for slot in range(SLOTS):
        held = owner.get(slot)
        bar.append(
            " ■ " if held is not None else " · ", style=COLOURS[held] if held is not None else "dim"
        )
    table = Table(box=None, header_style="bold")
    for column in ("job", "state", "priority", "workers", "allocation"):
        table.add_column(column)
    for i, view in enumerate(views.values()):
        running = sum(w.state == "running" for w in view.worker_list)
        table.add_row(
            Text(view.name, style=COLOURS[i]),
            view.state,
            str(view.priority),
            f"{running} running / {view.workers} allotted",
            Text("■" * view.workers, style=COLOURS[i]),
        )
    return Group(bar, Text(""), table, Text(""), *[Text(line, style="dim") for line in log[-6:]])


def wait_for(
    client: Client,
    live: Live,
    jobs: list[str],
    log: list[str],
    check: Callable[[list[JobDetail]], bool],
    timeout: float,
) -> None:
    """Redraw until ``check(views)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [client.get(job) for job in jobs]
        live.update(render(client, jobs, log))
        if check(views):
            return
        time.sleep(0.25)
    raise SystemExit("the demo took too long; is the machine very busy?")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # A closed terminal or a kill ends the demo like Ctrl-C does: through the cleanup below,
    # since the server and its jobs run in sessions of their own.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tidal-demo-") as tmp:
        folder = Path(tmp)
        server = start_server(folder)
        try:
            with (
                Client(data_dir=folder / "data", timeout=30) as client,
                Live(console=console, refresh_per_second=8) as live,
            ):
                log: list[str] = []

                def say(text: str) -> None:
                    log.append(f"{time.strftime('%H:%M:%S')}  {text}")

                def settled(view: JobView) -> int:
                    detail = client.get(view.id)
                    return sum(w.state == "running" for w in detail.worker_list)

                say("job1 submitted (1-8 workers, priority 5000): it takes every free slot")
                job1 = client.submit(job_spec("job1", 10, folder)).id
                jobs = [job1]
                wait_for(client, live, jobs, log, lambda v: settled(v[0]) == SLOTS, 180)

                say("job2 submitted with the same priority: job1 gives back 4 slots")
                job2 = client.submit(job_spec("job2", 12, folder)).id
                jobs.append(job2)
                wait_for(client, live, jobs, log, lambda v: [settled(x) for x in v] == [4, 4], 180)

                say("job2's priority raised to 10000: shares become 1/3 and 2/3 of 8 → 3 / 5")
                client.priority(job2, 10000)
                wait_for(client, live, jobs, log, lambda v: [settled(x) for x in v] == [3, 5], 180)

                say("waiting for job1 to finish; job2 then grows into its slots")
                wait_for(client, live, jobs, log, lambda v: v[0].state == "succeeded", 300)
                wait_for(
                    client,
                    live,
                    jobs,
                    log,
                    lambda v: settled(v[1]) == SLOTS or v[1].state != "running",
                    180,
                )
                say("job2 runs on all 8 slots; waiting for it to finish")
                wait_for(
                    client, live, jobs, log, lambda v: v[1].state in ("succeeded", "failed"), 300
                )
                say("done: no job was stopped or restarted from disk on the way")
                live.update(render(client, jobs, log))
                timeline = [(a.job_id[:4], a.count) for a in client.allocations()]
            console.print()
            console.print(f"allocation timeline: {timeline}")
            for name in ("job1", "job2"):
                result = folder / f"{name}.json"
                if result.exists():
                    console.print(f"{name}: {result.read_text().strip()}")
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=10)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)  # interrupted; everything was stopped on the way out
