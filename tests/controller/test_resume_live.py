"""A job released to zero slots and given slots again at once, on a real ``tidal server``.

The job's agent outlives the release (it waits for slots): the workers it then starts
must join the restart generation, not take the earlier one that released everyone for
their own release (they used to exit as released, over and over, until the restart limit
failed the job).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tests.runtime.launcher import steps
from tidal.client import Client

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "elastic_digits.py"
#: Generous for a loaded two-core machine; every wait ends on what it waits for.
TIMEOUT = 240.0


def test_a_job_released_to_zero_and_resumed_at_once_trains_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    server = start_server(tmp_path, slots=2)
    try:
        client = Client(data_dir=tmp_path / "data")
        command = [sys.executable, str(SCRIPT), "--out", str(out), "--epochs", "100000"]
        job = client.submit(
            {"name": "a", "command": [*command, "--step-delay", "0.05"], "workers": "1:2"}
        )
        until(lambda: any(r["step"] >= 3 for r in steps(out)), TIMEOUT, "training")
        host = client.cluster().hosts[0].name
        # No room elsewhere: the job checkpoints and is released to zero slots.
        client.drain(host, 1.0)
        until(lambda: client.get(job.id).state == "queued", TIMEOUT, "the release")
        client.undrain(host)
        until(
            lambda: sum(r["gen"] > 0 for r in steps(out)) > 10,
            TIMEOUT,
            "training after the resume",
        )
        detail = client.get(job.id)
        assert detail.state == "running", detail.reason
        assert detail.restarts == 0, [e.message for e in client.events(job.id)]
        records = steps(out)
        released_at = max(r["step"] for r in records if r["gen"] == 0)
        # Resumed from the checkpoint written at the release, not from the start.
        assert min(r["step"] for r in records if r["gen"] > 0) == released_at + 1
        client.cancel(job.id)
    finally:
        stop_server(server)
