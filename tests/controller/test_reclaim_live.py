"""The reclaim scene end to end: a real server with team queues, the local backend, real
training.

8 slots; team a and team b are guaranteed 4 each. a's elastic job borrows all 8; b submits
a job of 4 → a's job shrinks to 4 at a step boundary (no restart, its step counter goes on)
and b's job gets the 4 slots; b's job ends → a's job grows back to 8 and finishes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"
#: Job a: trains until it was on 8, shrunk and on 8 again, however long the scene takes.
BORROWER = Path(__file__).resolve().parents[1] / "scripts" / "reclaim_digits.py"
STEPS_PER_EPOCH = -(-1437 // 64)  # the digits' training split at a global batch of 64
MIN_EPOCHS = 8

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Client]:
    teams = tmp_path / "teams.yaml"
    teams.write_text("teams:\n  - {name: a, guaranteed: 4}\n  - {name: b, guaranteed: 4}\n")
    process = start_server(tmp_path, "--teams", str(teams), slots=8)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            yield client
    finally:
        stop_server(process)
        agents = subprocess.run(
            ["pgrep", "-f", f"tidal.launch.agent .*{tmp_path}"], capture_output=True, text=True
        )
        assert agents.stdout == "", "agents left behind"


def spec(name: str, workers: dict[str, int], command: list[str]) -> dict[str, object]:
    return {"name": name, "team": name, "command": command, "workers": workers}


def test_a_loan_is_taken_back_by_shrinking_the_borrower(server: Client, tmp_path: Path) -> None:
    client = server

    def running(job: str) -> int:
        return sum(w.state == "running" for w in client.get(job).worker_list)

    borrower = ["python", str(BORROWER), "--full", "8", "--min-epochs", str(MIN_EPOCHS)]
    a_result = tmp_path / "a.json"
    a = client.submit(spec("a", {"min": 1, "max": 8}, [*borrower, "--result", str(a_result)])).id
    until(lambda: running(a) == 8, 180, "a's job on 8 workers")
    queues = {q.team: q for q in client.queues()}
    assert (queues["a"].borrowed, queues["b"].lent) == (4, 4)

    example = ["python", str(EXAMPLE), "--epochs", "1", "--step-delay", "0.05"]
    b = client.submit(
        spec("b", {"min": 4, "max": 4}, [*example, "--result", str(tmp_path / "b.json")])
    ).id
    until(lambda: running(a) == 4 and running(b) == 4, 180, "a shrunk to 4, b on 4")
    assert client.get(a).state in ("running", "rescaling"), "a ended before b took its 4"

    assert client.wait(b, timeout=300).state == "succeeded"
    until(lambda: running(a) == 8 or client.get(a).state == "succeeded", 180, "a back on 8")
    assert client.wait(a, timeout=600).state == "succeeded"

    # The allocation timeline: 8, then 4 beside b's 4, then 8 again.
    counts = {a: 0, b: 0}
    phases: list[tuple[int, int]] = []
    for point in sorted(client.allocations(), key=lambda p: p.time):
        counts[point.job_id] = point.count
        if not phases or phases[-1] != (counts[a], counts[b]):
            phases.append((counts[a], counts[b]))
    wanted = iter(phases)
    assert all(p in wanted for p in [(8, 0), (4, 4), (8, 0)]), phases

    # Shrunk in place: no restart, the step counter never went back, no step lost.
    assert client.get(a).restarts == 0
    kinds = [e.kind for e in client.events(a)]
    assert "restart" not in kinds and "failed" not in kinds, kinds
    steps = [m.step for m in sorted(client.metrics(a), key=lambda m: m.time)]
    assert steps == sorted(steps), steps
    result = json.loads(a_result.read_text())
    assert result["epochs"] >= MIN_EPOCHS, result
    assert result["steps"] == result["epochs"] * STEPS_PER_EPOCH, result
    assert result["accuracy"] > 0.95, result

    # Both sides say why.
    assert any(
        e.kind == "reclaimed" and "reclaimed by team b" in e.message for e in client.events(a)
    )
    assert any(
        e.kind == "reclaimed" and e.message == "reclaimed by team b from team a"
        for e in client.events(b)
    )
