"""BatchNorm and dropout that do not depend on the number of workers.

The same BatchNorm model (then with dropout too) is trained alone and under ``tidal run``
(3 workers with uneven shares of a batch of 64, then 2 after a resize). With
``sync_batchnorm=True`` (and ``per_sample_rng=True`` for dropout) the loss of every step and
the final parameters and running statistics equal the alone run's; without the option,
already the first step's loss differs (which shows the comparison can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.runtime.launcher import Launch, max_relative_difference

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "batchnorm_job.py"
#: float64; only the order of the sums over ranks differs.
TOLERANCE = 1e-9


def global_losses(out: Path) -> dict[int, float]:
    """Per step, the loss of the global batch: the share-weighted sum of the ranks'."""
    parts: dict[int, list[dict[str, float]]] = defaultdict(list)
    for path in out.glob("steps-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            parts[record["step"]].append(record)
    return {
        step: sum(r["loss"] * r["share"] for r in group) / group[0]["batch"]
        for step, group in sorted(parts.items())
    }


def _run_alone(tmp_path_factory: pytest.TempPathFactory, *script_args: str) -> Path:
    out = tmp_path_factory.mktemp("alone")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *script_args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return out


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_alone(tmp_path_factory)


DROPOUT = ("--dropout", "0.3")


def _launch(
    tmp_path: Path,
    launcher_args: list[str],
    *,
    sync: bool,
    script_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[Launch, Path]:
    """``tidal run`` of the script (``sync``: with ``--sync-batchnorm``)."""
    out = tmp_path / "out"
    out.mkdir()
    script = [str(SCRIPT), "--out", str(out), *(["--sync-batchnorm"] if sync else []), *script_args]
    launch = Launch(
        [*launcher_args, "--timeout", "5", "--", *script], home=tmp_path / "home", env=env
    )
    return launch, out


def _assert_rescaled_run_matches(
    launches: list[Launch],
    tmp_path: Path,
    alone: Path,
    script_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> None:
    """3 workers, then 2 after a resize: every step's loss and the final state as alone."""
    launch, out = _launch(
        tmp_path,
        ["--workers", "1:3", "--initial", "3", "--resize-at", "4:2"],
        sync=True,
        # The resize lands before the 8 steps are over.
        script_args=("--hold-at", "4", *script_args),
        env=env,
    )
    launches.append(launch)
    assert launch.finish(timeout=180) == 0, launch.output()
    worlds = {
        json.loads(line)["world"]
        for p in out.glob("steps-*.jsonl")
        for line in p.read_text().splitlines()
    }
    assert worlds == {3, 2}, worlds
    expected, got = global_losses(alone), global_losses(out)
    assert sorted(got) == sorted(expected)
    for step, loss in expected.items():
        assert abs(got[step] - loss) <= TOLERANCE * abs(loss), (step, got[step], loss)
    assert max_relative_difference(out / "final.pt", alone / "final.pt") < TOLERANCE


@pytest.mark.parametrize("gradient_sync", ["auto", "hook"])
def test_sync_batchnorm_matches_one_worker_across_a_rescale(
    launches: list[Launch], tmp_path: Path, alone: Path, gradient_sync: str
) -> None:
    # The statistics' gradient is weighted one way where DDP averages (gloo's default,
    # the guarded group) and another where the hook weights and sums; the shares of 64
    # over 3 workers are uneven, which is where the two differ.
    _assert_rescaled_run_matches(
        launches, tmp_path, alone, env={"TIDAL_GRADIENT_SYNC": gradient_sync}
    )


def test_plain_batchnorm_depends_on_the_number_of_workers(
    launches: list[Launch], tmp_path: Path, alone: Path
) -> None:
    launch, out = _launch(tmp_path, ["--workers", "3:3"], sync=False)
    launches.append(launch)
    assert launch.finish(timeout=180) == 0, launch.output()
    first, reference = global_losses(out)[1], global_losses(alone)[1]
    assert abs(first - reference) > 1e-4 * abs(reference), (first, reference)


def test_per_sample_dropout_matches_one_worker_across_a_rescale(
    launches: list[Launch], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    options = (*DROPOUT, "--sync-batchnorm", "--per-sample-rng")
    alone = _run_alone(tmp_path_factory, *options)
    _assert_rescaled_run_matches(launches, tmp_path, alone, (*DROPOUT, "--per-sample-rng"))


def test_plain_dropout_depends_on_the_number_of_workers(
    launches: list[Launch], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    alone = _run_alone(tmp_path_factory, *DROPOUT, "--sync-batchnorm")
    launch, out = _launch(tmp_path, ["--workers", "3:3"], sync=True, script_args=DROPOUT)
    launches.append(launch)
    assert launch.finish(timeout=180) == 0, launch.output()
    first, reference = global_losses(out)[1], global_losses(alone)[1]
    assert abs(first - reference) > 1e-4 * abs(reference), (first, reference)
