"""``tidal.log_metrics`` in a real job reaches ``GET /jobs/{id}/metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"

pytestmark = pytest.mark.slow


def test_logged_metrics_arrive_through_the_api(tmp_path: Path) -> None:
    process = start_server(tmp_path)
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            job = client.submit(
                {
                    "name": "digits",
                    "command": ["python", str(EXAMPLE), "--epochs", "3", "--log-every", "5"],
                    "workers": {"min": 2, "max": 2},
                }
            ).id
            assert client.wait(job, timeout=240).state == "succeeded"
            until(lambda: len(client.metrics(job)) > 0, 10, "metrics")
            metrics = client.metrics(job)
    finally:
        stop_server(process)
    steps = [m.step for m in metrics]
    # 3 epochs of 23 steps, logged every 5th step by rank 0 only; the last batch may
    # still be in flight when the job ends, so allow the tail to be missing.
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    assert set(steps) <= set(range(5, 70, 5)) and len(steps) >= 10, steps
    assert {"loss", "accuracy", "samples_per_s"} <= set(metrics[0].values)
    assert metrics[-1].values["loss"] < metrics[0].values["loss"]
