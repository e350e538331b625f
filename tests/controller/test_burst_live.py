"""Requests are applied while jobs are being launched, against a real ``tidal server``
on 127.0.0.1 with the local backend.

Every agent of the burst is held at its start (a ``sitecustomize`` on the agents' path
waits for a gate file) for as long as the test likes: launches are in flight for certain,
not only on a slow machine. The cancels must be carried out meanwhile (the loop does not
wait for an agent to serve), the one of a job whose launch is in flight once its agent
serves, and no job may be started twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

pytestmark = pytest.mark.slow

JOBS = 40
SLOTS = 2
#: Queued jobs left to run once the gate opens (the rest are cancelled).
KEPT = 6

_GATE = """
import os, time
gate = os.environ.get("TIDAL_TEST_AGENT_GATE")
with open("/proc/self/cmdline", "rb") as own:
    argv = own.read().split(b"\\0")
if gate and b"tidal.launch.agent" in argv:
    while not os.path.exists(gate):
        time.sleep(0.05)
"""


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[Client, Path, Path]]:
    """A server of two slots whose agents wait for the gate file before they start."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_GATE)
    gate = tmp_path / "gate"
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "TIDAL_TEST_AGENT_GATE": str(gate)}
    process = start_server(tmp_path, slots=SLOTS, env=env)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client, tmp_path / "data", gate
    finally:
        gate.touch()  # agents still held would otherwise outlive the server's stop
        stop_server(process)


def test_cancels_are_applied_while_launches_are_in_flight(
    gated: tuple[Client, Path, Path],
) -> None:
    client, data, gate = gated
    ids = [client.submit({"name": f"burst-{i}", "command": ["/bin/true"]}).id for i in range(JOBS)]
    # The first launches: decided and recorded, their agents held at their start.
    until(
        lambda: sum(client.get(j).state == "running" for j in ids) == SLOTS,
        120,
        "two jobs launched (their agents held)",
    )
    launched = [j for j in ids if client.get(j).state == "running"]
    queued = [j for j in ids if client.get(j).state == "queued"]
    assert len(queued) == JOBS - SLOTS
    in_flight, cancelled = launched[0], [launched[0], *queued[KEPT:]]
    for job in cancelled:
        client.cancel(job)
    until(
        lambda: all(client.get(j).state == "cancelled" for j in cancelled),
        120,
        "the cancels applied",
    )
    # Applied while every launch was still in flight: no agent served yet.
    agents = data / "agents"
    assert not list(agents.glob("*.agent.json")), "an agent served before the gate opened"
    events = client.events(limit=10_000)
    assert not [e for e in events if e.kind in ("succeeded", "failed", "lost")], events

    gate.touch()
    rest = [j for j in ids if j not in cancelled]
    until(
        lambda: all(client.get(j).state == "succeeded" for j in rest),
        600,
        "the jobs left to run to succeed",
    )
    # The job cancelled in flight: its agent was told to stop once it served, and the
    # slot it held went to another job only after that (both slots served the rest).
    until(lambda: (agents / f"{in_flight}.final.json").exists(), 120, "its agent to end")
    final = json.loads((agents / f"{in_flight}.final.json").read_text())
    assert final["outcome"] in ("stopped", "succeeded"), final
    assert client.get(in_flight).state == "cancelled"

    events = client.events(limit=10_000)
    started: dict[str, int] = {}
    for event in events:
        if event.kind in ("started", "resumed"):
            assert event.job_id is not None
            started[event.job_id] = started.get(event.job_id, 0) + 1
    assert started == dict.fromkeys([*rest, in_flight], 1), "a job started twice, or none"
    assert not [e for e in events if e.kind in ("lost", "failed", "backend_error")], events
    # The queued jobs cancelled were applied before the queue drained: never started.
    last_start = max(e.id for e in events if e.kind == "started")
    for job in queued[KEPT:]:
        [done] = [e for e in events if e.job_id == job and e.kind == "cancelled"]
        assert done.id < last_start
