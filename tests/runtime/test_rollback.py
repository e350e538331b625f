"""Exact rollback: a peer killed at any point of a step leaves no trace in the result.

Each case kills one worker of 3 at one point of step 12 of a run with AdamW, a OneCycle
schedule and gradient clipping (tests/scripts/rollback_job.py); the survivors go on, a
replacement joins. The parameters after the last step must equal those of an
uninterrupted run (float64; only the order of the gradient sum differs), and every step
must have run with the same learning rate and betas.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.launcher import (
    Launch,
    assert_each_sample_once,
    assert_ranks_agree,
    final_history,
    max_relative_difference,
    steps,
)

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "rollback_job.py"
STEPS = 40
DIGITS = 1797
#: A different world sums the per-rank gradients in another order: last bits only. One
#: step run with the next step's learning rate moves the parameters by about 1e-5.
TOLERANCE = 1e-9


def _run(tmp_path: Path, name: str, workers: str, *script_args: str) -> tuple[Launch, Path]:
    out = tmp_path / name
    out.mkdir()
    low, _, high = workers.partition(":")
    launch = Launch(
        [
            "--workers",
            workers,
            "--initial",
            high or low,
            "--timeout",
            "5",
            "--",
            str(SCRIPT),
            "--out",
            str(out),
            "--steps",
            str(STEPS),
            *script_args,
        ],
        home=tmp_path / "home",
    )
    return launch, out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run on 3 workers."""
    tmp = tmp_path_factory.mktemp("rollback-reference")
    launch, out = _run(tmp, "fixed", "3:3")
    try:
        assert launch.finish(timeout=180) == 0, launch.output()
    finally:
        launch.close()
    return out


@pytest.mark.parametrize(
    ("point", "rank"),
    [
        ("before_forward", 1),
        ("after_backward", 1),
        ("after_optimizer", 2),
        ("after_scheduler", 1),
        ("after_scheduler", 0),
        ("in_step", 1),
    ],
)
def test_crash_at_any_point_of_a_step_leaves_the_result_unchanged(
    launches: list[Launch], tmp_path: Path, reference: Path, point: str, rank: int
) -> None:
    launch, out = _run(
        tmp_path,
        f"{point}-{rank}",
        "1:3",
        "--die-step",
        "12",
        "--die-point",
        point,
        "--die-rank",
        str(rank),
    )
    launches.append(launch)
    assert launch.finish(timeout=240) == 0, launch.output()
    assert (out / "died").exists(), "the crash was not injected"
    assert "failed" in launch.output()

    history = final_history(steps(out))
    expected = final_history(steps(reference))
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once_so_far(history)
    for step, group in history.items():
        ran = {(r["lr"], tuple(r["betas"])) for r in group}
        want = {(r["lr"], tuple(r["betas"])) for r in expected[step]}
        assert ran == want, f"step {step} ran with {ran}, the uninterrupted run with {want}"
    assert max_relative_difference(out / "final.pt", reference / "final.pt") < TOLERANCE


def assert_each_sample_once_so_far(history: dict[int, list[dict[str, object]]]) -> None:
    """The first epoch was consumed exactly once (the run stops inside the second)."""
    first = {s: g for s, g in history.items() if g[0]["epoch"] == 0}
    assert_each_sample_once(first, DIGITS)
