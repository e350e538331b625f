"""The adaptive batch size in real elastic runs: ranks agree, state survives."""

from __future__ import annotations

import itertools
import os
import signal
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

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "adaptive_digits.py"
DIGITS = 1797


def _run(
    launches: list[Launch],
    tmp_path: Path,
    *extra: str,
    epochs: int = 4,
    script_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[Launch, Path]:
    out = tmp_path / "out"
    out.mkdir()
    launch = Launch(
        [
            "--timeout",
            "5",
            *extra,
            "--",
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            str(epochs),
            *script_args,
        ],
        home=tmp_path / "home",
        env=env,
    )
    launches.append(launch)
    return launch, out


def _batches_agree(history: dict[int, list[dict[str, Any]]]) -> None:
    for step, group in history.items():
        assert len({r["batch"] for r in group}) == 1, f"step {step}: ranks disagree: {group}"
        assert len({r["noise_samples"] for r in group}) == 1, f"step {step}: {group}"


def test_batch_decisions_agree_and_survive_rescale(launches: list[Launch], tmp_path: Path) -> None:
    # Eight epochs: the autoscaled batch can reach 250 samples within the first epochs, and
    # the run must outlast a third worker's start (tens of seconds on a loaded machine).
    launch, out = _run(
        launches,
        tmp_path,
        "--workers",
        "1:3",
        "--initial",
        "2",
        "--resize-at",
        "20:3,80:1",
        epochs=8,
        # Asked for DDP's own all-reduce, the job still measures its gradients in the hook:
        # each generation's DDP, a newcomer's too, is rebuilt with it at the first batch.
        env={"TIDAL_GRADIENT_SYNC": "native"},
    )
    assert launch.finish(timeout=300) == 0, launch.output()
    history = final_history(steps(out))
    assert sorted(history) == list(range(1, len(history) + 1))
    assert_ranks_agree(history)  # same parameters everywhere, so the same batch too
    _batches_agree(history)
    assert_each_sample_once(history, DIGITS)  # whatever batch sizes the epochs went through
    worlds = [g[0]["world"] for g in history.values()]
    assert {1, 2, 3} <= set(worlds), worlds
    batches = [g[0]["batch"] for g in history.values()]
    assert len(set(batches)) > 1, "the batch was never re-chosen"
    # A new world is decided from the fitted model at its first step boundary, not after
    # steps timed at a batch sized for the old world's sync. Rank 0 decides; its line for a
    # step is written before that step's boundary, so the decision taken at the first
    # boundary alone shows from the second step on (whatever batch it chose: on a loaded
    # machine the one before may already be the best).
    alone = next(
        s
        for a, s in itertools.pairwise(sorted(history))
        if history[a][0]["world"] > 1 and history[s][0]["world"] == 1
    )
    assert history[alone + 1][0]["pending"] != "world", [
        (s, history[s][0]["world"], history[s][0]["batch"], history[s][0]["pending"])
        for s in range(alone - 1, alone + 6)
        if s in history
    ]
    # Statistics are never lost: newcomers received them with the state, every rank keeps
    # adding to them, and progress (in initial-batch steps) only grows.
    samples = [g[0]["noise_samples"] for g in history.values()]
    assert all(b >= a for a, b in itertools.pairwise(samples)), samples
    progress = [g[0]["progress"] for g in history.values()]
    assert all(b > a for a, b in itertools.pairwise(progress))
    # The statistics are read in the hook, alone too (where it skips the collective).
    assert {r["gradient_sync"] for g in history.values() for r in g} == {"hook"}
    assert "restarts: 0" in launch.output(), launch.output()


@pytest.mark.parametrize("loader_workers", [0, 2], ids=["", "loader-workers"])
def test_adaptive_state_survives_a_durable_restart(
    launches: list[Launch], tmp_path: Path, loader_workers: int
) -> None:
    ckpt = tmp_path / "ckpt"
    launch, out = _run(
        launches,
        tmp_path,
        "--workers",
        "2:2",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "5",
        epochs=3,
        script_args=("--num-workers", str(loader_workers)),
    )
    launch.wait_for(lambda _: len(final_history(steps(out))) >= 45, timeout=180)
    before = final_history(steps(out))
    for pid in list(launch.worker_pids.values()):
        os.kill(pid, signal.SIGKILL)
    assert launch.finish(timeout=300) == 0, launch.output()
    assert "restarting from the latest checkpoint" in launch.output()
    records = steps(out)
    history = final_history(records)
    assert sorted(history) == list(range(1, len(history) + 1))
    _batches_agree(history)
    assert_each_sample_once(history, DIGITS)
    # The first step after the restart resumed what the checkpoint held: the statistics
    # and the chosen batch, not a fresh start.
    restart_gen = max(r["gen"] for r in records)
    resumed = min(
        (r for r in records if r["gen"] == restart_gen and r["rank"] == 0), key=lambda r: r["step"]
    )
    assert resumed["step"] > 1, "restarted from scratch, not from the checkpoint"
    checkpointed = before[resumed["step"] - 1][0]
    assert resumed["noise_samples"] >= checkpointed["noise_samples"] > 0, (resumed, checkpointed)
    assert resumed["batch"] == checkpointed["batch"]
    assert resumed["progress"] >= checkpointed["progress"] > 0
    if loader_workers:
        # Batches were fetched ahead while the batch size changed and across the crash:
        # each rank trained exactly its share of each step's global batch.
        batches = [g[0]["batch"] for g in history.values()]
        assert len(set(batches)) > 1, "the batch was never re-chosen"
        for step, group in history.items():
            for record in group:
                assert record["batch_ids"] == record["indices"], f"step {step}: {record}"
