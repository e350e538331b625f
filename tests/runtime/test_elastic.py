"""Elastic runs with real processes, gloo groups, resizes and SIGKILLs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

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
from tidal.runtime.data import shard_bounds

pytestmark = pytest.mark.slow

DIGITS = 1797
EPOCHS = 5
STEPS = EPOCHS * -(-DIGITS // 64)
#: Relative tolerance on final parameters (float64 training): a different world sums the
#: per-rank gradients in another order, which changes the last bits only.
TOLERANCE = 1e-9


def _run(
    launches: list[Launch],
    tmp_path: Path,
    name: str,
    workers: str,
    *extra: str,
    script_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[Launch, Path]:
    out = tmp_path / name
    out.mkdir()
    launch = Launch(
        [
            "--workers",
            workers,
            "--timeout",
            "5",
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
        env=env,
    )
    launches.append(launch)
    return launch, out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final parameters of a run fixed at 2 workers, its gradients weighted and summed by
    the hook: a mechanism of its own, against which DDP's average (with the output
    scaling where shares are uneven) is checked by the runs below."""
    tmp = tmp_path_factory.mktemp("reference")
    started: list[Launch] = []
    try:
        launch, out = _run(started, tmp, "fixed", "2:2", env={"TIDAL_GRADIENT_SYNC": "hook"})
        assert launch.finish(timeout=180) == 0, launch.output()
    finally:
        for item in started:
            item.close()
    history = final_history(steps(out))
    assert len(history) == STEPS
    assert {r["world"] for g in history.values() for r in g} == {2}
    assert {r["gradient_sync"] for g in history.values() for r in g} == {"hook"}
    return out / "final.pt"


def test_resized_run_matches_fixed_run(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    launch, out = _run(
        launches,
        tmp_path,
        "resized",
        "1:4",
        "--initial",
        "2",
        "--resize-at",
        "3:4,40:1,50:3",
        # Each resize lands within the run however slowly newcomers start.
        script_args=("--step-delay", "0.1", "--hold-at", "3:4,40:1,50:3"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS + 1))
    worlds = [g[0]["world"] for g in history.values()]
    visited = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    # Newcomers are admitted as soon as each is ready, so a grow may pass through
    # intermediate sizes; the planned sizes must all be visited, in order.
    planned = iter(visited)
    assert all(size in planned for size in (2, 4, 1, 3)), visited
    # Alone, a worker trains without DDP (nothing to all-reduce); in a group, on gloo, DDP
    # over the guarded group.
    syncs = {(r["world"] == 1, r["gradient_sync"]) for g in history.values() for r in g}
    assert syncs == {(True, "alone"), (False, "guarded")}, syncs
    assert_ranks_agree(history)  # newcomers hold the survivors' parameters at every step
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "restarts: 0" in launch.output(), launch.output()


def test_micro_batches_match_fixed_run(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    """3 workers split each batch of 64 as 21/21/22, in micro-batches of 7: DDP's average
    over the guarded group, the shares weighted on the model's output, ends where the
    hook's run at 2 workers does."""
    launch, out = _run(launches, tmp_path, "micro", "3:3", script_args=("--micro-batch-size", "7"))
    assert launch.finish(timeout=180) == 0, launch.output()
    history = final_history(steps(out))
    assert {r["gradient_sync"] for g in history.values() for r in g} == {"guarded"}
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE


def test_native_allreduce_with_uneven_shares_matches_fixed_run(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    """DDP's own all-reduce (what NCCL jobs use) with the share weighting on the model's
    output: 3 workers split each batch of 64 as 21/21/22, in micro-batches of 7, and end
    where the hook's run at 2 workers does."""
    launch, out = _run(
        launches,
        tmp_path,
        "native",
        "3:3",
        script_args=("--micro-batch-size", "7"),
        env={"TIDAL_GRADIENT_SYNC": "native"},
    )
    assert launch.finish(timeout=180) == 0, launch.output()
    history = final_history(steps(out))
    assert {r["gradient_sync"] for g in history.values() for r in g} == {"native"}
    assert {r["world"] for g in history.values() for r in g} == {3}
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE


def assert_batches_are_the_planned_shares(history: dict[int, list[dict[str, Any]]]) -> None:
    """Every rank trained exactly its share of the step's global batch for the world it
    trained in, and the batch it held was that share: never one fetched ahead for another
    world, batch size or position."""
    for step, group in history.items():
        for record in group:
            batch = record["global_indices"]
            lo, hi = shard_bounds(len(batch), record["world"], record["rank"])
            assert record["indices"] == batch[lo:hi], f"step {step}: {record}"
            assert record["batch_ids"] == record["indices"], f"step {step}: {record}"


def test_resized_run_with_loader_workers_matches_fixed_run(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # Loader workers read ahead for the world they were planned in; each resize makes
    # those batches stale. 2 -> 3 -> 1 workers, each with two loader worker processes.
    launch, out = _run(
        launches,
        tmp_path,
        "loader-workers",
        "1:3",
        "--initial",
        "2",
        "--resize-at",
        "3:3,40:1",
        script_args=("--num-workers", "2", "--step-delay", "0.02", "--hold-at", "3:3,40:1"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS + 1))
    worlds = [g[0]["world"] for g in history.values()]
    visited = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    planned = iter(visited)
    assert all(size in planned for size in (2, 3, 1)), visited
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert_batches_are_the_planned_shares(history)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "restarts: 0" in launch.output(), launch.output()


@pytest.mark.parametrize(
    ("victim", "loader_workers"),
    [("w1", 0), ("w0", 0), ("w1", 2)],
    ids=["other-rank", "rank-0", "other-rank-loader-workers"],
)
def test_sigkill_one_worker_redoes_at_most_one_step(
    launches: list[Launch], tmp_path: Path, reference: Path, victim: str, loader_workers: int
) -> None:
    launch, out = _run(
        launches,
        tmp_path,
        f"kill-{victim}-{loader_workers}",
        "1:3",
        "--initial",
        "3",
        script_args=("--step-delay", "0.03", "--num-workers", str(loader_workers)),
    )
    launch.wait_for(lambda _: len(final_history(steps(out))) >= 15, timeout=120)
    os.kill(launch.worker_pids[victim], signal.SIGKILL)
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    # Per surviving worker, a step number committed twice means it was redone.
    redone = {}
    for worker in {p.stem for p in out.glob("steps-*.jsonl")}:
        mine = [r["step"] for r in records if f"steps-{r.get('worker', '')}" == worker]
        redone[worker] = len(mine) - len(set(mine))
    assert all(v <= 1 for v in redone.values()), redone
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "failed" in launch.output()
    if loader_workers:
        # The survivors' batches prefetched for the world of three were dropped.
        assert_batches_are_the_planned_shares(history)


def test_peer_lost_after_the_optimizer_step_keeps_the_step(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # Rank 1 dies once the gradient sync of step 20 has completed everywhere, and the
    # survivors learn of it before their step boundary: their update of step 20 is
    # complete and must stand, not be redone on top of itself.
    launch, out = _run(
        launches,
        tmp_path,
        "late-failure",
        "1:3",
        "--initial",
        "3",
        script_args=("--rank1-dies-after-step", "20"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    # Each of the three workers logged step 20 once; a redo would log it again.
    assert [r["step"] for r in records].count(20) == 3, "step 20 was redone"
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "failed" in launch.output()


def test_peer_lost_before_ddp_settles_its_buckets_leaves_the_survivor_training(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # DDP's second forward of a generation rebuilds its gradient buckets with a broadcast
    # of its own. Rank 1 dies just before step 2: rank 0's broadcast meets a dead peer,
    # which once raised out of the script's model(x) and failed the survivor too (the job
    # then restarted from its checkpoint). Now it is a failed collective like any other:
    # the survivor drops the step and goes on, and the run matches the fixed one.
    launch, out = _run(
        launches,
        tmp_path,
        "rebuild-failure",
        "1:2",
        script_args=("--rank1-dies-before-step", "2"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    output = launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    # One failure (the killed rank), and its peer was never without a survivor's state.
    assert "restarts: 1" in output, output
    assert "no survivor" not in output, output
    assert [line for line in output.splitlines() if "failed: w0 " in line] == [], output
    assert {r["worker"] for r in history[STEPS]} >= {"w0"}, history[STEPS]


def test_a_peer_killed_while_the_others_all_reduce_leaves_them_training(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # Rank 1 SIGKILLs itself after step 20's forward, while ranks 0 and 2 already wait
    # for its gradients inside DDP's all-reduce (in backward()). The failure guard must
    # release them: the step is dropped and redone at 2 workers, neither survivor fails
    # (unguarded, gloo's error raises out of backward() and each survivor dies with it).
    killed_in = 20
    launch, out = _run(
        launches,
        tmp_path,
        "in-backward",
        "1:3",
        "--initial",
        "3",
        script_args=("--rank1-dies-in-backward", str(killed_in)),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    output = launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    victim = next(r["worker"] for r in records if r["rank"] == 1 and r["step"] == killed_in - 1)
    survivors = {r["worker"] for r in records if r["gen"] == 0} - {victim}
    assert len(survivors) == 2, survivors
    # The launcher's events: only the victim failed.
    failed = [line for line in output.splitlines() if "tidal failed: " in line]
    assert failed and all(f"tidal failed: {victim} " in line for line in failed), output
    assert "no survivor" not in output, output
    assert {r["worker"] for r in history[killed_in]} >= survivors, history[killed_in]


def test_a_step_committed_by_one_survivor_is_adopted_not_redone(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    # Rank 1 dies after step 20's gradient sync; rank 2 commits step 20 on the complete
    # gradient, rank 0 hears of the failure first and skips its optimizer step (as a rank
    # whose sync failed would: with a ring all-reduce some ranks finish it and some do not).
    # The survivors then hold different steps: rank 0 must take rank 2's step 20 rather
    # than hand rank 2 its older state, which would make rank 2 train step 20 twice.
    launch, out = _run(
        launches,
        tmp_path,
        "split-commit",
        "1:3",
        "--initial",
        "3",
        script_args=("--rank1-dies-after-step", "20", "--rank0-misses-the-step"),
    )
    assert launch.finish(timeout=240) == 0, launch.output()
    records = steps(out)
    at_20: dict[str, bool] = {}
    for record in records:
        if record["step"] == 20:
            at_20.setdefault(record["worker"], record["stepped"])
    assert at_20 == {"w0": False, "w1": True, "w2": True}, at_20  # the interleaving above
    for worker in ("w2", "w0"):
        mine = [r["step"] for r in records if r["worker"] == worker]
        assert len(mine) == len(set(mine)), f"{worker} ran a step twice"
    history = final_history(records)
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE
    assert "failed" in launch.output()


def test_sigkill_all_workers_resumes_from_checkpoint(
    launches: list[Launch], tmp_path: Path, reference: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    launch, out = _run(
        launches,
        tmp_path,
        "kill-all",
        "2:2",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "5",
        script_args=("--step-delay", "0.03"),
    )
    launch.wait_for(lambda _: len(final_history(steps(out))) >= 22, timeout=120)
    for pid in list(launch.worker_pids.values()):
        os.kill(pid, signal.SIGKILL)
    assert launch.finish(timeout=240) == 0, launch.output()
    assert "restarting from the latest checkpoint" in launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, STEPS + 1))
    assert_ranks_agree(history)
    assert_each_sample_once(history, DIGITS)
    # Exact continuation: model, optimizer, scheduler and data position all came back.
    assert max_relative_difference(out / "final.pt", reference) < TOLERANCE


def test_workers_exit_cleanly(launches: list[Launch], tmp_path: Path) -> None:
    """A finished worker exits 0, never aborting on a collective still in flight (which
    the launcher would take for a failure and recover from)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "synthetic_mlp.py"
    for trial in range(3):
        launch = Launch(
            ["--workers", "2", "--", str(example), "--steps", "30", "--params", "1e5"],
            home=tmp_path / f"home-{trial}",
        )
        launches.append(launch)
        assert launch.finish(timeout=120) == 0, launch.output()
        assert "restarts: 0" in launch.output(), launch.output()
        assert "terminate called" not in launch.output(), launch.output()
