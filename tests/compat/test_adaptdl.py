"""AdaptDL's entry points: an AdaptDL-style script trained under a real ``tidal run``
while it is resized and restarted, and the checks of what the names take."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.runtime.launcher import Launch
from tidal.compat.adaptdl import (
    Accumulator,
    AdaptiveDataLoader,
    current_dataloader,
    remaining_epochs_until,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adaptdl_digits.py"
#: Training samples per epoch: the digits' 1437 training rows in whole batches of 64.
PER_EPOCH = 1437 // 64 * 64
_TRAIN_EPOCH = re.compile(r"Train Epoch: (\d+) \[")


def _launch(tmp_path: Path, *run_args: str, epochs: int) -> tuple[Launch, Path]:
    result = tmp_path / "result.json"
    launch = Launch(
        [
            *run_args,
            "--",
            str(EXAMPLE),
            "--epochs",
            str(epochs),
            "--result",
            str(result),
        ],
        home=tmp_path,
    )
    return launch, result


@pytest.mark.slow
def test_adaptdl_script_trains_while_resized_and_sums_every_sample(
    launches: list[Launch], tmp_path: Path
) -> None:
    # The grow is asked for at step 2 and the run is long enough that the newcomer's start
    # (seconds on a quiet machine, several times that on a loaded one) lands before its end.
    epochs = 12
    launch, result = _launch(
        tmp_path, "--workers", "1:3", "--initial", "2", "--resize-at", "2:3,60:1", epochs=epochs
    )
    launches.append(launch)
    assert launch.finish(timeout=280) == 0, launch.output()
    final = json.loads(result.read_text())
    assert final["accuracy"] > 0.93, final
    assert (final["epoch"], final["workers"]) == (epochs - 1, 1)
    out = launch.output()
    assert "generation 1 (resize)" in out and "generation 2 (resize)" in out, out
    # The accumulator summed every worker's share of every batch, the shares of the two
    # workers released at step 60 included: each epoch's samples exactly once.
    assert final["samples"] == epochs * PER_EPOCH, final


@pytest.mark.slow
def test_remaining_epochs_until_resumes_at_the_checkpointed_epoch(
    launches: list[Launch], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    launch, result = _launch(
        tmp_path,
        "--workers",
        "2:2",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "5",
        epochs=5,
    )
    launches.append(launch)
    # Kill every worker once the job is in its third epoch (epoch 2).
    launch.wait_for(lambda lines: any("Train Epoch: 2 [10/" in line for line in lines), 240)
    before = len(launch.lines)
    for pid in list(launch.worker_pids.values()):
        os.kill(pid, signal.SIGKILL)
    assert launch.finish(timeout=280) == 0, launch.output()
    out = launch.output()
    assert "restarting from the latest checkpoint" in out, out
    resumed = [
        int(m.group(1)) for line in launch.lines[before:] if (m := _TRAIN_EPOCH.search(line))
    ]
    # The restarted workers go on in epoch 2 (checkpointed within it), not from epoch 0.
    assert resumed and resumed[0] == 2, resumed
    assert json.loads(result.read_text())["epoch"] == 4


def test_loader_refuses_what_it_cannot_honour() -> None:
    with pytest.raises(ValueError, match=r"does not support custom 'sampler'"):
        AdaptiveDataLoader(list(range(8)), batch_size=2, sampler=iter(range(8)))
    with pytest.raises(TypeError, match=r"unsupported argument\(s\) generator, timeout"):
        AdaptiveDataLoader(list(range(8)), batch_size=2, timeout=5, generator=None)


def test_accumulator_reads_empty_until_synchronized_then_holds_the_sums() -> None:
    acc = Accumulator(seen=1)
    acc["loss"] += 2.5
    acc["loss"] += 0.5
    acc.update(correct=3)
    acc -= {"correct": 1}
    acc += {"seen": 4}
    assert len(acc) == 0 and "loss" not in acc and dict(acc) == {}
    with acc.synchronized():
        assert dict(acc) == {"seen": 5, "loss": 3.0, "correct": 2}
        acc["rate"] = acc["correct"] / acc["seen"]
        with acc.synchronized():  # nested: already the sums
            assert acc["rate"] == 0.4
    with pytest.raises(TypeError, match=r"accumulator\['loss'\]: only \+= and -= outside"):
        acc["loss"] = 1.0
    with acc.synchronized():
        assert acc["loss"] == 3.0  # nothing pending was lost or counted twice


def test_a_validation_loader_makes_a_whole_pass_each_loop() -> None:
    loader = AdaptiveDataLoader(list(range(10)), batch_size=4)
    seen = []
    for _ in range(2):
        for batch in loader:
            assert current_dataloader() is loader
            with pytest.raises(RuntimeError, match="accumulator may not be initialized"):
                Accumulator()
            with pytest.raises(RuntimeError, match="overlapping dataloader iterations"):
                next(iter(loader))
            seen.extend(batch.tolist())
        assert current_dataloader() is None
    assert seen == list(range(10)) * 2


def test_epochs_need_the_data_parallel_model_first() -> None:
    with pytest.raises(RuntimeError, match=r"build AdaptiveDataParallel\(model, optimizer\) first"):
        next(remaining_epochs_until(3))
