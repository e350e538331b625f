"""``tidal server --policy goodput`` on live reports: slots go to the job that scales.

Two jobs on 4 slots. ``flat`` sleeps a fixed time per step, whatever its worker count;
``scales`` sleeps in proportion to its per-worker batch. Both report their measured
throughput model; the policy must end up giving ``scales`` more slots than ``flat``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.controller.live import start_server, stop_server, until
from tidal.client import Client
from tidal.policy.api import Cluster, Host, JobRequest
from tidal.policy.goodput import GoodputPolicy
from tidal.policy.goodput_model import model_from_dict

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "scaling_job.py"

pytestmark = pytest.mark.slow


def _spec(name: str, *args: str) -> dict[str, object]:
    return {
        "name": name,
        "command": [sys.executable, str(SCRIPT), *args],
        "workers": {"min": 1, "max": 4},
        "checkpoint_every_seconds": 0,
    }


def test_goodput_policy_gives_more_slots_to_the_job_that_scales(tmp_path: Path) -> None:
    process = start_server(
        tmp_path, "--policy", "goodput", "--policy-option", "reallocation_delay=2", slots=4
    )
    try:
        with Client(data_dir=tmp_path / "data", timeout=30) as client:
            assert client.cluster().policy == "goodput"
            # The flat job first: alone it holds all 4 slots, then shares with the other,
            # so it is measured at two sizes and its flat step time shows.
            flat = client.submit(_spec("flat", "--fixed", "0.06")).id
            until(lambda: client.get(flat).workers == 4, 120, "flat on 4 slots")
            until(lambda: client.get(flat).speedup is not None, 120, "flat's first report")
            scales = client.submit(_spec("scales", "--per-sample", "0.002")).id

            def reported(job: str) -> bool:
                view = client.get(job)
                return view.goodput is not None and view.goodput.get("step_time") is not None

            def settled() -> bool:
                a, b = client.get(scales), client.get(flat)
                return (
                    a.state == b.state == "running"
                    and a.workers > b.workers
                    and reported(scales)
                    and reported(flat)
                )

            until(settled, 240, "more slots for the job that scales")
            # And it stays so while both jobs report anew: the decision rests on their
            # measured models, and the policy plans with the newest ones.
            moves = len(client.allocations())
            seen: dict[str, set[int]] = {scales: set(), flat: set()}

            def reported_anew() -> bool:
                for job, steps in seen.items():
                    report = client.get(job).goodput
                    if report is not None:
                        steps.add(int(report["step"]))
                return all(len(steps) > 3 for steps in seen.values())

            until(reported_anew, 120, "three new reports of each job")
            assert settled(), (client.get(scales).workers, client.get(flat).workers)
            assert len(client.allocations()) == moves, client.allocations()[moves:]
            views = {name: client.get(job) for name, job in (("scales", scales), ("flat", flat))}
            for job in (scales, flat):
                client.cancel(job)
    finally:
        stop_server(process)

    counts = {name: view.workers for name, view in views.items()}
    assert counts["scales"] > counts["flat"] >= 1, counts
    # The reports read through the API say why: the scaling job's predicted speed-up.
    reports = {name: view.goodput for name, view in views.items()}
    assert all(r is not None and r["model"] for r in reports.values()), reports
    models = {name: model_from_dict(r["model"]) for name, r in reports.items() if r}
    # The same policy object the simulator runs, on the same models, from scratch.
    fresh = GoodputPolicy().allocate(
        [JobRequest(name, 1, 4, throughput=model) for name, model in models.items()],
        Cluster((Host("local", 4),)),
        {},
    )
    assert len(fresh["scales"]) > len(fresh["flat"]), (fresh, models)
