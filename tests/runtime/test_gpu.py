"""``tidal run`` on real GPUs with NCCL: a world-1 job, a checkpoint restart after a
SIGKILL, and (with two GPUs) a rescale 1 -> 2 -> 1 and a peer killed while the survivor's
all-reduce waits for it. The CPU versions are in ``test_elastic.py``; these run the same
script (``tests/scripts/elastic_digits.py``, float64) on ``cuda:0`` of each worker's GPU.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.runtime.launcher import (
    SCRIPT,
    Launch,
    assert_each_sample_once,
    assert_ranks_agree,
    final_history,
    max_relative_difference,
    steps,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

DIGITS = 1797
EPOCHS = 3
STEPS = EPOCHS * -(-DIGITS // 64)
#: Relative tolerance on final parameters (float64): another world sums the per-rank
#: gradients in another order, which changes the last bits only.
TOLERANCE = 1e-9
#: Seconds before a silent peer counts as dead (``tidal run --timeout``).
TIMEOUT = 20.0


def _run(
    launches: list[Launch],
    tmp_path: Path,
    name: str,
    workers: str,
    *extra: str,
    script_args: tuple[str, ...] = (),
) -> tuple[Launch, Path]:
    out = tmp_path / name
    out.mkdir()
    launch = Launch(
        [
            "--workers",
            workers,
            "--timeout",
            str(TIMEOUT),
            *extra,
            "--",
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            str(EPOCHS),
            *script_args,
        ],
        home=tmp_path / "home",
        # NCCL, never a silent fall-back to gloo on the CPU.
        env={"TIDAL_BACKEND": "nccl"},
    )
    launches.append(launch)
    return launch, out


def _assert_on_gpus(records: list[dict[str, object]]) -> None:
    assert records, "no steps recorded"
    assert {r["backend"] for r in records} == {"nccl"}, {r["backend"] for r in records}
    assert {r["device"] for r in records} == {"cuda:0"}, {r["device"] for r in records}


@pytest.fixture(scope="module")
def world_1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An uninterrupted world-1 run on NCCL: its output folder and what it printed."""
    tmp = tmp_path_factory.mktemp("world-1")
    started: list[Launch] = []
    try:
        launch, out = _run(started, tmp, "fixed", "1")
        assert launch.finish(timeout=240) == 0, launch.output()
        return out, launch.output()
    finally:
        for item in started:
            item.close()


@pytest.fixture(scope="module")
def reference(world_1: tuple[Path, str]) -> Path:
    """Final parameters of the world-1 run."""
    return world_1[0] / "final.pt"


def test_a_world_1_job_trains_on_nccl_and_finishes(world_1: tuple[Path, str]) -> None:
    out, output = world_1
    assert "restarts: 0" in output, output
    assert f"finished at step {STEPS}" in output, output
    records = steps(out)
    _assert_on_gpus(records)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert {r["world"] for g in history.values() for r in g} == {1}
    assert_each_sample_once(history, DIGITS)
    assert (out / "final.pt").exists()


def test_sigkill_resumes_from_the_checkpoint_on_the_gpu(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    launch, out = _run(
        launches,
        tmp_path,
        "kill",
        "1",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "5",
        script_args=("--step-delay", "0.03"),
    )
    launch.wait_for(lambda _: len(final_history(steps(out))) >= 22, timeout=180)
    os.kill(launch.worker_pids["w0"], signal.SIGKILL)
    assert launch.finish(timeout=240) == 0, launch.output()
    output = launch.output()
    assert "restarting from the latest checkpoint" in output, output
    records = steps(out)
    _assert_on_gpus(records)
    # The replacement goes on from a checkpoint's step (a multiple of 5), not from step 1:
    # the step count continues.
    resumed = min(r["step"] for r in records if r["worker"] != "w0")
    killed_at = max(r["step"] for r in records if r["worker"] == "w0")
    assert 5 < resumed <= killed_at + 1 and (resumed - 1) % 5 == 0, (resumed, killed_at)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_each_sample_once(history, DIGITS)
    # Exact continuation: model, optimizer, scheduler and data position all came back.
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE


@pytest.mark.gpu(2)
def test_rescale_1_2_1_across_two_gpus_covers_each_sample_once(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    launch, out = _run(
        launches,
        tmp_path,
        "resized",
        "1:2",
        "--initial",
        "1",
        "--resize-at",
        "10:2,50:1",
        # Each resize lands within the run however slowly the newcomer starts.
        script_args=("--step-delay", "0.05", "--hold-at", "10:2,50:1"),
    )
    assert launch.finish(timeout=300) == 0, launch.output()
    records = steps(out)
    _assert_on_gpus(records)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    worlds = [g[0]["world"] for g in history.values()]
    visited = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    assert visited == [1, 2, 1], visited
    # Two workers on two GPUs: each its own (CUDA_VISIBLE_DEVICES), both cuda:0.
    assert len({r["worker"] for g in history.values() for r in g if r["world"] == 2}) == 2
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "restarts: 0" in launch.output(), launch.output()


@pytest.mark.gpu(2)
def test_a_peer_killed_while_the_survivor_all_reduces_leaves_it_training_within_the_timeout(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # Rank 1 SIGKILLs itself before step 20's forward; rank 0 computes its gradient and its
    # NCCL all-reduce waits for a peer that is gone. NCCL itself notices nothing (the
    # peer's buffers just stay silent): the survivor must learn of the death from the
    # launcher, abort the broken communicator and train on, within --timeout, without
    # being killed by NCCL's watchdog or restarted.
    killed_before = 20
    launch, out = _run(
        launches,
        tmp_path,
        "mid-all-reduce",
        "1:2",
        script_args=("--rank1-dies-before-step", str(killed_before)),
    )
    assert launch.finish(timeout=300) == 0, launch.output()
    output = launch.output()
    records = steps(out)
    _assert_on_gpus(records)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    # The killed rank, and only it, failed; the survivor kept its state and trained on.
    assert "restarts: 1" in output, output
    assert "no survivor" not in output, output
    assert [line for line in output.splitlines() if "failed: w0 " in line] == [], output
    victim = next(r["worker"] for r in records if r["rank"] == 1 and r["step"] == killed_before - 1)
    last_sign = max(r["time"] for r in records if r["worker"] == victim)
    survivor = min(
        r["time"]
        for r in records
        if r["worker"] == "w0" and r["step"] == killed_before and r["gen"] > 0
    )
    # Not a speed goal: the bound is the --timeout a user sets for "a peer is dead".
    assert survivor - last_sign < TIMEOUT, (
        f"the survivor trained step {killed_before} {survivor - last_sign:.1f}s after its "
        f"peer's last step (--timeout {TIMEOUT:.0f}s)"
    )
