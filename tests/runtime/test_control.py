"""The control channel and mixed precision, with real processes and gloo groups.

The step boundary's collectives run on a CPU gloo group of their own, so a step issues
nothing on the main group but its gradients; a ``GradScaler`` passed to ``State`` travels
with rescales and rollbacks, and a step it skips is a step with no update, not a failure;
bf16 autocast and ``torch.compile`` train through a rescale.
"""

from __future__ import annotations

import itertools
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.launcher import (
    Launch,
    assert_each_sample_once,
    assert_ranks_agree,
    final_history,
    steps,
)

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "amp_digits.py"
DIGITS = 1797
STEPS_PER_EPOCH = -(-DIGITS // 64)
INIT_SCALE = 2.0**8
GROWTH_INTERVAL = 4


def _run(
    launches: list[Launch],
    tmp_path: Path,
    workers: str,
    *extra: str,
    script_args: tuple[str, ...] = (),
    timeout: str = "5",
) -> tuple[Launch, Path]:
    out = tmp_path / "out"
    out.mkdir()
    command = ["--workers", workers, "--timeout", timeout, *extra, "--", str(SCRIPT)]
    launch = Launch(
        [*command, "--out", str(out), *script_args],
        home=tmp_path / "home",
    )
    launches.append(launch)
    return launch, out


def _switch_steps(records: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(worker, step) of each step after which the worker changed generation: its state
    transfer to newcomers runs on the main group then, by design."""
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_worker[record["worker"]].append(record)
    switched = set()
    for worker, mine in by_worker.items():
        for a, b in itertools.pairwise(mine):
            if b["gen"] != a["gen"]:
                switched.add((worker, a["step"]))
    return switched


def _bucket_settling_steps(records: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(worker, step) of each worker's second step in each generation."""
    by_generation: dict[tuple[str, int], list[int]] = defaultdict(list)
    for record in records:
        by_generation[(record["worker"], record["gen"])].append(record["step"])
    return {
        (worker, sorted(mine)[1]) for (worker, _), mine in by_generation.items() if len(mine) > 1
    }


def test_a_step_issues_nothing_on_the_main_group_but_its_gradients(
    launches: list[Launch], tmp_path: Path
) -> None:
    # 2 workers, then 3: the control group is formed again with each generation.
    launch, out = _run(
        launches,
        tmp_path,
        "2:3",
        "--initial",
        "2",
        "--resize-at",
        "6:3",
        script_args=("--epochs", "1", "--hold-at", "6:3"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS_PER_EPOCH + 1))
    assert {r["world"] for r in records} == {2, 3}
    assert_ranks_agree(history)
    # A gloo group of its own, in every generation.
    assert {r["control"] for r in records} == {"ProcessGroupGloo"}, records[0]
    switched = _switch_steps(records)
    settling = _bucket_settling_steps(records)
    for record in records:
        # The gradient all-reduce (one bucket for this model) is the main group's only
        # collective; the agreement used to add one to every step.
        assert record["main_in_backward"] == 1, record
        where = (record["worker"], record["step"])
        if where in switched:
            continue
        if where in settling:
            # DDP's own, once a generation: at its second forward it broadcasts the bucket
            # order it recorded (the sizes, then the indices).
            assert record["main_outside_backward"] == 2, record
        else:
            assert record["main_outside_backward"] == 0, record


def _expected_scale(step: int, skipped: set[int]) -> float:
    """The scale after ``step`` committed steps: doubled after every GROWTH_INTERVAL
    finite steps in a row, halved (and the count restarted) at a skipped one."""
    scale, run = INIT_SCALE, 0
    for s in range(1, step + 1):
        if s in skipped:
            scale, run = scale / 2, 0
        else:
            run += 1
            if run == GROWTH_INTERVAL:
                scale, run = scale * 2, 0
    return scale


def test_a_step_the_scaler_skips_is_no_update_and_no_failure(
    launches: list[Launch], tmp_path: Path
) -> None:
    launch, out = _run(
        launches, tmp_path, "2:2", script_args=("--epochs", "1", "--scaler", "--inf-at", "6")
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    assert "restarts: 0" in launch.output(), launch.output()
    # No failure: one generation, every step once per worker, none redone.
    assert {r["gen"] for r in records} == {0}
    for worker in ("w0", "w1"):
        mine = [r["step"] for r in records if r["worker"] == worker]
        assert mine == list(range(1, STEPS_PER_EPOCH + 1)), mine
    for record in records:
        assert record["stepped"] == (record["step"] != 6), record  # no update at step 6
        assert record["scale"] == _expected_scale(record["step"], {6}), record
    by_step: dict[int, set[tuple[float, float]]] = defaultdict(set)
    for record in records:
        by_step[record["step"]].add(tuple(record["checksum"]))
    assert all(len(sums) == 1 for sums in by_step.values()), by_step
    assert by_step[6] == by_step[5]  # the skipped step left the parameters as they were


def test_scaler_state_survives_a_rescale_and_a_rollback(
    launches: list[Launch], tmp_path: Path
) -> None:
    # 2 workers, a newcomer at step 6 (it must receive the scale, not start from the
    # initial one), then rank 1 dies before step 20's forward: the survivors' gradient
    # sync fails, the scaler's update of that step runs anyway, and the step is rolled
    # back and redone. Were the scaler's growth count not put back, the redo would count
    # the step twice and every later scale would come one step early.
    launch, out = _run(
        launches,
        tmp_path,
        "1:3",
        "--initial",
        "2",
        "--resize-at",
        "6:3",
        script_args=(
            "--epochs",
            "1",
            "--scaler",
            "--hold-at",
            "6:3",
            "--rank1-dies-before-step",
            "20",
        ),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS_PER_EPOCH + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    # The rollback happened: a survivor recorded step 20 without an update, then redid it.
    failed = [r for r in records if r["step"] == 20 and not r["stepped"]]
    assert failed, "no rank saw step 20's gradient sync fail"
    assert "failed" in launch.output()
    assert {r["world"] for r in records} >= {2, 3}
    for step, group in history.items():
        for record in group:
            assert record["scale"] == _expected_scale(step, set()), record


def test_bf16_autocast_trains_through_rescales(launches: list[Launch], tmp_path: Path) -> None:
    launch, out = _run(
        launches,
        tmp_path,
        "1:3",
        "--initial",
        "2",
        "--resize-at",
        "5:3,15:1",
        script_args=("--epochs", "1", "--bf16", "--scaler", "--hold-at", "5:3,15:1"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS_PER_EPOCH + 1))
    worlds = [g[0]["world"] for g in history.values()]
    assert {2, 3, 1} <= set(worlds), worlds
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert "restarts: 0" in launch.output(), launch.output()


@pytest.mark.skipif(sys.platform != "linux", reason="torch.compile's CPU backend needs gcc")
def test_a_compiled_module_trains_through_a_rescale(launches: list[Launch], tmp_path: Path) -> None:
    # Each worker compiles before it joins; the generous timeout covers a newcomer that
    # compiles a new graph on a busy machine.
    launch, out = _run(
        launches,
        tmp_path,
        "1:2",
        "--initial",
        "1",
        "--resize-at",
        "4:2",
        script_args=("--epochs", "1", "--compile", "--hold-at", "4:2"),
        timeout="120",
    )
    assert launch.finish(timeout=900) == 0, launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS_PER_EPOCH + 1))
    assert {g[0]["world"] for g in history.values()} == {1, 2}
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
